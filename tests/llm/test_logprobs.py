"""token_logprobs / pad_batch on models: alignment, padding sides, gradients, the masked head.

The kernels on tensors (selective_log_softmax and its kin) are in test_selective_log_softmax.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ragrl.llm import logprobs as lp_mod
from ragrl.llm.logprobs import pad_batch, token_logprobs

VOCAB = 97


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


SEQS = [[5, 9, 13, 2, 40, 41, 7], [3, 4], [8, 60, 61, 62, 63], [11, 12, 13, 14, 15, 16, 17, 18, 19]]


def _reference(model: LlamaForCausalLM, seq: list[int], temperature: float) -> torch.Tensor:
    """Scores of seq[1:], one unpadded forward pass per prefix, plain float32 log_softmax."""
    out = []
    with torch.no_grad():
        for t in range(len(seq) - 1):
            logits = model(torch.tensor([seq[: t + 1]])).logits[0, -1].float()
            out.append(torch.log_softmax(logits / temperature, -1)[seq[t + 1]])
    return torch.stack(out)


def test_pad_batch_sides() -> None:
    ids, mask = pad_batch([[1, 2, 3], [4]], pad_id=0, side="left")
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_batch([[1, 2, 3], [4]], pad_id=9, side="right")
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == torch.long and mask.dtype == torch.long
    with pytest.raises(ValueError):
        pad_batch([[1]], 0, side="middle")  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.9])
def test_alignment_matches_prefix_by_prefix_reference(model: LlamaForCausalLM, temperature: float) -> None:
    ids, mask = pad_batch(SEQS, 0, "right")
    with torch.no_grad():
        out = token_logprobs(model, ids, mask, temperature=temperature)
    assert out.shape == (len(SEQS), ids.shape[1] - 1) and out.dtype == torch.float32
    for b, seq in enumerate(SEQS):
        ref = _reference(model, seq, temperature)
        torch.testing.assert_close(out[b, : len(seq) - 1], ref, atol=1e-5, rtol=0)
        assert torch.all(out[b, len(seq) - 1 :] == 0)  # targets that are padding score 0


def test_left_and_right_padding_agree(model: LlamaForCausalLM) -> None:
    """Rotary positions from the mask: the padding side does not change any value."""
    left_ids, left_mask = pad_batch(SEQS, 0, "left")
    right_ids, right_mask = pad_batch(SEQS, 0, "right")
    with torch.no_grad():
        left = token_logprobs(model, left_ids, left_mask, temperature=0.7)
        right = token_logprobs(model, right_ids, right_mask, temperature=0.7)
    width = left_ids.shape[1]
    for b, seq in enumerate(SEQS):
        n = len(seq) - 1
        torch.testing.assert_close(left[b, width - 1 - n :], right[b, :n], atol=1e-5, rtol=0)


def test_start_scores_a_suffix(model: LlamaForCausalLM) -> None:
    ids, mask = pad_batch(SEQS, 0, "right")
    with torch.no_grad():
        full = token_logprobs(model, ids, mask)
        tail = token_logprobs(model, ids, mask, start=3)
    assert tail.shape == (len(SEQS), ids.shape[1] - 3)
    # out[b, j] scores input_ids[b, start + j]; full[b, t] scores input_ids[b, t + 1].
    torch.testing.assert_close(tail, full[:, 2:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        token_logprobs(model, ids, mask, start=0)


def test_model_without_logits_to_keep(model: LlamaForCausalLM) -> None:
    class Plain(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):  # noqa: ANN001
            return self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
            )

    ids, mask = pad_batch(SEQS, 0, "right")
    with torch.no_grad():
        a = token_logprobs(model, ids, mask, start=2)
        b = token_logprobs(Plain(model), ids, mask, start=2)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_token_logprobs_with_grad_matches_plain_autograd(model: LlamaForCausalLM) -> None:
    ids, mask = pad_batch(SEQS, 0, "right")
    model.zero_grad()
    out = token_logprobs(model, ids, mask, temperature=0.8)
    out.sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=lp_mod.position_ids_from_mask(mask)
    ).logits
    ref = torch.log_softmax(logits[:, :-1].float() / 0.8, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (ref * mask[:, 1:]).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(ours[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)
    model.zero_grad()


@pytest.mark.parametrize("logits_to_keep", [True, False])
def test_token_logprobs_scores_the_models_logits_whole(
    model: LlamaForCausalLM, logits_to_keep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No slice between the model's logits and the scoring when the model returned just the positions
    scored (a slice's backward zero-fills a tensor their size); a model that returned every position
    gets a slice, read in place. The values are the same either way."""
    monkeypatch.setattr(lp_mod, "accepts_logits_to_keep", lambda _model: logits_to_keep)
    seen = []
    apply = lp_mod._SelectiveLogSoftmax.apply
    monkeypatch.setattr(
        lp_mod._SelectiveLogSoftmax,
        "apply",
        lambda logits, *a: seen.append(logits.grad_fn) or apply(logits, *a),
    )
    ids, mask = pad_batch(SEQS, 0, "right")
    out, entropy = token_logprobs(model, ids, mask, start=3, temperature=0.8, with_entropy=True)
    assert ("Slice" in type(seen[0]).__name__) is not logits_to_keep
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=lp_mod.position_ids_from_mask(mask)
    ).logits
    logp = torch.log_softmax(logits[:, 2:-1].float() / 0.8, -1)
    ref = logp.gather(-1, ids[:, 3:, None]).squeeze(-1)
    torch.testing.assert_close(out, torch.where(mask[:, 3:].bool(), ref, 0.0), atol=1e-5, rtol=0)
    ref_entropy = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(entropy, torch.where(mask[:, 3:].bool(), ref_entropy, 0.0), atol=1e-5, rtol=0)


def _tiny_llama(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(3)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0,
        eos_token_id=1, bos_token_id=None, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _random_mask(ids: torch.Tensor, start: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(ids.shape[0], ids.shape[1] - start, generator=g) < 0.5).float()
    mask[0, -1] = 1.0  # last positions: padding when right-padded (still 0), tokens when left-padded
    mask[1, -1] = 1.0
    return mask


@pytest.mark.parametrize(
    ("start", "side", "tied"), [(1, "right", False), (3, "right", True), (1, "left", True)]
)
def test_mask_scores_only_masked_positions_with_the_same_values_and_gradients(
    start: int, side: str, tied: bool
) -> None:
    model = _tiny_llama(tied)
    ids, attn = pad_batch(SEQS, 0, side)  # type: ignore[arg-type]
    mask = _random_mask(ids, start)
    full, full_h = token_logprobs(model, ids, attn, start=start, temperature=0.7, with_entropy=True)
    keep = mask.bool() & attn[:, start:].bool()
    (full * keep).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    calls = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    part, part_h = token_logprobs(
        model, ids, attn, start=start, temperature=0.7, with_entropy=True, mask=mask
    )
    hook.remove()
    assert calls == [(int(keep.sum()), 32)]  # the head saw only the kept positions
    part.sum().backward()
    assert keep.sum() > 3 and (~keep).sum() > 3
    torch.testing.assert_close(part[keep], full[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part_h[keep], full_h[keep], rtol=1e-5, atol=1e-5)
    assert part[~keep].abs().sum() == 0 and part_h[~keep].abs().sum() == 0
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_empty_mask_scores_nothing_and_still_backpropagates(model: LlamaForCausalLM) -> None:
    ids, attn = pad_batch(SEQS, 0, "right")
    lp = token_logprobs(model, ids, attn, mask=torch.zeros(ids.shape[0], ids.shape[1] - 1))
    assert lp.shape == (ids.shape[0], ids.shape[1] - 1) and lp.abs().sum() == 0
    lp.sum().backward()  # no error: a micro-batch without policy tokens
    model.zero_grad()


def test_mask_of_the_wrong_shape_is_refused(model: LlamaForCausalLM) -> None:
    ids, attn = pad_batch(SEQS, 0, "right")
    with pytest.raises(ValueError, match="mask must have shape"):
        token_logprobs(model, ids, attn, mask=torch.ones(ids.shape[0], ids.shape[1]))


def test_mask_keeps_the_models_own_logit_transform() -> None:
    """Gemma 2 soft-caps its logits after the head: the masked path runs the model's own forward, so
    the soft-capped values come out, equal to the full path's."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=64, max_position_embeddings=128, final_logit_softcapping=2.0,
        initializer_range=0.5, pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )  # fmt: skip
    gemma = Gemma2ForCausalLM(cfg).eval()
    ids, attn = pad_batch(SEQS, 0, "right")
    mask = _random_mask(ids, 1)
    keep = mask.bool() & attn[:, 1:].bool()
    with torch.no_grad():
        full = token_logprobs(gemma, ids, attn)
        part = token_logprobs(gemma, ids, attn, mask=mask)
        gemma.config.final_logit_softcapping = None
        uncapped = token_logprobs(gemma, ids, attn)
    torch.testing.assert_close(part[keep], full[keep], rtol=1e-5, atol=1e-5)
    assert (uncapped[keep] - full[keep]).abs().max() > 1e-2  # the cap matters at this scale


def test_models_not_of_transformers_get_full_logits_zeroed_off_the_mask(
    model: LlamaForCausalLM,
) -> None:
    ids, attn = pad_batch(SEQS, 0, "right")
    mask = _random_mask(ids, 1)
    keep = mask.bool() & attn[:, 1:].bool()
    with torch.no_grad():
        want = token_logprobs(model, ids, attn)

    class NoKeep(torch.nn.Module):  # its forward takes no logits_to_keep
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):  # noqa: ANN001, ANN201
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)

    class IntOnly(NoKeep):  # takes logits_to_keep but ignores it (returns every position's logits)
        def forward(
            self, input_ids, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0
        ):  # noqa: ANN001, ANN201
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)

    for wrapper in (NoKeep(model), IntOnly(model)):
        with torch.no_grad():
            got = token_logprobs(wrapper, ids, attn, mask=mask)
        torch.testing.assert_close(got[keep], want[keep])
        assert got[~keep].abs().sum() == 0
    assert lp_mod._masked_head_supported(wrapper) is False  # not one of transformers' own models


def _without_logits_to_keep(model: LlamaForCausalLM, after=None) -> LlamaForCausalLM:  # noqa: ANN001
    """``model`` with an instance forward that takes no ``logits_to_keep`` (the head then gets every
    position's hidden states), calling ``after(model, out)`` on its output when given."""
    original = model.forward

    def forward(**kwargs):  # noqa: ANN003, ANN202
        out = original(**kwargs)
        return after(model, out) if after is not None else out

    model.forward = forward
    return model


@pytest.mark.parametrize(("start", "side"), [(1, "right"), (3, "left")])
def test_the_masked_head_needs_no_logits_to_keep(start: int, side: str) -> None:
    """A model whose forward takes no ``logits_to_keep``: the head's input is ``[B, L, H]`` and the hook
    takes positions s - 1 .. L - 2 of it."""
    ids, attn = pad_batch(SEQS, 0, side)  # type: ignore[arg-type]
    mask = _random_mask(ids, start)
    keep = mask.bool() & attn[:, start:].bool()
    with torch.no_grad():
        want = token_logprobs(_tiny_llama(True), ids, attn, start=start)
    plain = _without_logits_to_keep(_tiny_llama(True))  # the same weights
    calls = []
    plain.lm_head.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    with torch.no_grad():
        got = token_logprobs(plain, ids, attn, start=start, mask=mask)
    assert not lp_mod.accepts_logits_to_keep(plain) and calls == [(int(keep.sum()), 32)]
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
    assert got[~keep].abs().sum() == 0


def _head_again(model, out):  # noqa: ANN001, ANN202 - an auxiliary head, say
    model.lm_head(torch.zeros(len(SEQS), 1, 32))
    return out


def _logits_reshaped(model, out):  # noqa: ANN001, ANN202 - a [1, N, V] batch of the head's [N, V]
    if out.logits.dim() == 2:
        out.logits = out.logits[None]
    return out


@pytest.mark.parametrize("odd", [_head_again, _logits_reshaped])
def test_a_model_whose_head_is_not_the_one_call_gets_full_logits_and_it_is_remembered(odd) -> None:  # noqa: ANN001
    """A model that calls its head again, or changes the logits' shape: refused after that forward, the
    same values from the full logits, and full logits from then on."""
    ids, attn = pad_batch(SEQS, 0, "right")
    mask = _random_mask(ids, 1)
    keep = mask.bool() & attn[:, 1:].bool()
    with torch.no_grad():
        want = token_logprobs(_tiny_llama(False), ids, attn)
    model = _without_logits_to_keep(_tiny_llama(False), after=odd)
    assert lp_mod._masked_head_supported(model)
    for _ in range(2):
        with torch.no_grad():
            got = token_logprobs(model, ids, attn, mask=mask)
        torch.testing.assert_close(got[keep], want[keep])
        assert got[~keep].abs().sum() == 0
        assert lp_mod._masked_head_supported(model) is False  # remembered after the first call


def test_the_masked_head_runs_under_fsdp2(one_process_group) -> None:  # noqa: ANN001
    """FSDP2 gives the model a class of its own (``FSDPLlamaForCausalLM``, defined in torch) that keeps
    transformers' forward: the head still sees the kept rows only, with the unsharded model's values."""
    from torch.distributed.fsdp import fully_shard

    ids, attn = pad_batch(SEQS, 0, "right")
    mask = _random_mask(ids, 2)
    keep = mask.bool() & attn[:, 2:].bool()
    want = token_logprobs(_tiny_llama(True), ids, attn, start=2)
    model = _tiny_llama(True)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)  # as ragrl.train.parallel shards a policy
    assert not type(model).__module__.startswith("transformers.")
    calls = []
    model.lm_head.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    got = token_logprobs(model, ids, attn, start=2, mask=mask)
    got.sum().backward()
    assert calls == [(int(keep.sum()), 32)]
    torch.testing.assert_close(got[keep], want[keep].detach(), rtol=1e-5, atol=1e-5)
    assert model.lm_head.weight.grad is not None


def test_cache_keyword_follows_the_forward_signature():
    from ragrl.llm.logprobs import cache_keyword

    class New(torch.nn.Module):  # transformers >= 5.24
        def forward(self, input_ids=None, cache=None, use_cache=None):  # noqa: ANN001, ANN202
            return input_ids

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):  # noqa: ANN001, ANN202
            return input_ids

    assert cache_keyword(New()) == "cache" and cache_keyword(Old()) == "past_key_values"
