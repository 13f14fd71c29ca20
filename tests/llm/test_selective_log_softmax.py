"""selective_log_softmax / shifted_log_softmax / entropy_from_logits on tensors: values and gradients
against plain autograd, chunking, slices read in place, bf16, second-order refusal."""

from __future__ import annotations

import pytest
import torch

from ragrl.llm import logprobs as lp_mod
from ragrl.llm.logprobs import entropy_from_logits, selective_log_softmax


def _matches_plain_autograd(leaf: torch.Tensor, ours, plain, weights: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """``ours()`` and ``plain()`` (log-probs from ``leaf``) agree in value and in the gradient of their
    ``weights``-weighted sum at ``leaf``; returns ours's gradient."""
    scored = ours()
    (scored * weights).sum().backward()
    grad = leaf.grad.clone()
    leaf.grad = None
    reference = plain()
    (reference * weights).sum().backward()
    torch.testing.assert_close(scored, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, leaf.grad, atol=1e-5, rtol=0)
    return grad


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_selective_log_softmax_values_and_grads(temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", 3 * 50)  # force several chunks
    torch.manual_seed(1)
    logits = (3 * torch.randn(2, 7, 50)).requires_grad_()
    index = torch.randint(0, 50, (2, 7))
    _matches_plain_autograd(
        logits,
        lambda: selective_log_softmax(logits, index, temperature),
        lambda: torch.log_softmax(logits / temperature, -1).gather(-1, index[..., None]).squeeze(-1),
        torch.randn(2, 7),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_a_slice_of_the_logits_is_scored_where_it_lies(temperature: float, monkeypatch) -> None:  # noqa: ANN001
    """``token_logprobs`` scores ``logits[:, :-1]``: chunks are views of it (no copy of the logits, in
    the forward, the backward or the entropy) and the values and gradients are plain autograd's."""
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", 3 * 50)  # chunks of at most 3 rows
    torch.manual_seed(5)
    full = (3 * torch.randn(3, 8, 50)).requires_grad_()
    logits = full[:, :-1]  # rows not one block in memory
    assert not logits.is_contiguous()
    chunks = list(lp_mod._row_chunks(logits.detach()))
    # each sequence's 7 rows in chunks of 3: rows 0-6, 7-13, 14-20 of the flattened [21, 50]
    assert [(first, c.shape[0]) for first, c in chunks] == [
        (0, 3), (3, 3), (6, 1), (7, 3), (10, 3), (13, 1), (14, 3), (17, 3), (20, 1)
    ]  # fmt: skip
    base = full.untyped_storage().data_ptr()
    assert all(c.untyped_storage().data_ptr() == base for _, c in chunks)  # views, not copies
    index = torch.randint(0, 50, (3, 7))
    grad_ours = _matches_plain_autograd(
        full,
        lambda: selective_log_softmax(logits, index, temperature),
        lambda: torch.log_softmax(logits / temperature, -1).gather(-1, index[..., None]).squeeze(-1),
        torch.randn(3, 7),
    )
    assert not grad_ours[:, -1].any()  # the unscored last position gets no gradient
    logp = torch.log_softmax(logits.detach() / temperature, -1)
    torch.testing.assert_close(
        entropy_from_logits(logits, temperature), -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0
    )


def test_shifted_log_softmax_scores_all_but_the_last_position() -> None:
    """What ``token_logprobs`` calls on a model's output: the slice's values and gradients, the last
    position's gradient exactly 0, and the gradient the logits' own shape (no slice in the graph)."""
    torch.manual_seed(6)
    logits = (3 * torch.randn(3, 8, 50)).requires_grad_()
    targets = torch.randint(0, 50, (3, 7))
    weights = torch.randn(3, 7)
    ours = lp_mod.shifted_log_softmax(logits, targets, 0.8)
    assert ours.shape == (3, 7)
    scoring = ours.grad_fn.next_functions[0][0]  # under the output's own (small) slice
    assert type(scoring).__name__.startswith("_SelectiveLogSoftmax")
    assert scoring.next_functions[0][0].variable is logits  # the logits whole, not a slice of them
    grad_ours = _matches_plain_autograd(
        logits,
        lambda: lp_mod.shifted_log_softmax(logits, targets, 0.8),
        lambda: torch.log_softmax(logits[:, :-1] / 0.8, -1).gather(-1, targets[..., None]).squeeze(-1),
        weights,
    )
    assert torch.equal(grad_ours[:, -1], torch.zeros(3, 50))


def test_selective_log_softmax_gradcheck() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, 4, 11, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 11, (3, 4))
    # The forward computes in float32, so compare with a tolerance suited to it.
    assert torch.autograd.gradcheck(
        lambda x: selective_log_softmax(x, index, 0.8).double(), (logits,), eps=1e-3, atol=1e-3, rtol=1e-2
    )


def test_bf16_logits_are_scored_in_float32() -> None:
    torch.manual_seed(3)
    logits = (4 * torch.randn(4, 33)).to(torch.bfloat16)
    index = torch.randint(0, 33, (4,))
    ours = selective_log_softmax(logits, index)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, index[:, None]).squeeze(-1)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_logits_get_the_float32_gradient_in_bf16(
    temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backward computes each chunk's gradient in float32 and writes it into a bf16 gradient: what
    plain autograd over the float32 upcast gives, rounded once to bf16."""
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", 2 * 33)  # several chunks
    torch.manual_seed(4)
    logits = (4 * torch.randn(5, 33)).to(torch.bfloat16).requires_grad_()
    index = torch.randint(0, 33, (5,))
    weights = torch.randn(5)
    (selective_log_softmax(logits, index, temperature) * weights).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    ref = torch.log_softmax(logits.float() / temperature, -1).gather(-1, index[:, None]).squeeze(-1)
    (ref * weights).sum().backward()
    assert ours.dtype == torch.bfloat16
    # within one bf16 rounding step (exp(log_softmax) and softmax may differ in float32's last bit)
    torch.testing.assert_close(ours, logits.grad, atol=0, rtol=2**-7)


def test_a_second_order_gradient_is_refused_not_wrong() -> None:
    """The backward works in place on its chunks: differentiating it again raises."""
    logits = torch.randn(3, 11, requires_grad=True)
    out = selective_log_softmax(logits, torch.tensor([1, 4, 9]))
    (grad,) = torch.autograd.grad(out.sum(), logits, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        grad.sum().backward()
