"""Generation backends: greedy = argmax, log-probs = the training recompute, exact sampling, stops,
seeds, batch independence; the vLLM mapping without vLLM (the real engine: test_vllm_backend.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ragrl.errors import RagrlError
from ragrl.llm.backend import GenerationBackend, SamplingParams
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.llm.logprobs import pad_batch, token_logprobs
from ragrl.llm.sampling import truncate
from ragrl.llm.vllm_backend import to_generation, vllm_sampling_kwargs

WORDS = [f"w{i}" for i in range(90)]


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    hf.add_tokens(["<search>", "</search>"])
    return hf


def make_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        initializer_range=0.2,  # peaked enough that the tests see more than a uniform distribution
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    return make_model(len(tok))


@pytest.fixture(scope="module")
def backend(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> TransformersBackend:
    return TransformersBackend(model, tok, batch_size=8, prefix_cache_mb=0)  # exact-equality tests


PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16, 17], [20], [30, 31, 32]]


def test_is_a_generation_backend(backend: TransformersBackend) -> None:
    assert isinstance(backend, GenerationBackend)
    assert backend.device.type == "cpu" and backend.dtype == torch.float32


# (a) -------------------------------------------------------------------------------------------
def test_greedy_equals_stepwise_argmax(backend: TransformersBackend, model: LlamaForCausalLM) -> None:
    gens = backend.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0))
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        seq = list(prompt)
        for tok_id, lp in zip(gen.token_ids, gen.logprobs, strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0, -1]
            assert tok_id == int(logits.argmax())
            assert math.isclose(lp, float(torch.log_softmax(logits, -1)[tok_id]), abs_tol=1e-5)
            seq.append(tok_id)
            if tok_id == 1:
                break


# (b) -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.5, 0.9])
def test_logprobs_equal_right_padded_training_recompute(
    backend: TransformersBackend, model: LlamaForCausalLM, temperature: float
) -> None:
    assert model.config.model_type == "llama"  # rotary positions: padding handling matters
    params = SamplingParams(max_new_tokens=16, temperature=temperature, seed=7)
    gens = backend.generate(PROMPTS, params)  # left-padded, KV cache
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens, strict=True)]
    ids, mask = pad_batch(seqs, backend.pad_token_id, "right")
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, temperature=temperature or 1.0)
    worst = 0.0
    for b, (p, g) in enumerate(zip(PROMPTS, gens, strict=True)):
        ref = lp[b, len(p) - 1 : len(p) - 1 + len(g.token_ids)]
        worst = max(worst, float((ref - torch.tensor(g.logprobs)).abs().max()))
    assert worst < 1e-5, worst


# (c) -------------------------------------------------------------------------------------------
N_SAMPLES = 4000
T_DIST = 0.9
DIST_PROMPT = [3, 4, 5]


def _first_token_counts(backend: TransformersBackend, params: SamplingParams) -> torch.Tensor:
    gens = backend.generate([DIST_PROMPT] * N_SAMPLES, params)
    ids = torch.tensor([g.token_ids[0] for g in gens])
    return torch.bincount(ids, minlength=len(backend.tokenizer)).double()


@pytest.fixture(scope="module")
def first_token_probs(model: LlamaForCausalLM) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([DIST_PROMPT])).logits[0, -1].double()
    return torch.softmax(logits / T_DIST, -1)


def test_sampling_is_exactly_softmax_over_temperature(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, first_token_probs: torch.Tensor
) -> None:
    be = TransformersBackend(model, tok, batch_size=1000)
    counts = _first_token_counts(
        be, SamplingParams(max_new_tokens=1, temperature=T_DIST, top_k=0, top_p=1.0, seed=3)
    )
    p = first_token_probs
    tv = 0.5 * float((counts / N_SAMPLES - p).abs().sum())
    assert tv < 0.06, tv  # sampling noise alone: E[TV] ~ 0.04 at this N and vocabulary
    assert chisquare(counts.numpy(), (p * N_SAMPLES).numpy()).pvalue > 1e-3
    # The log-probs reported for the sampled tokens are those of the same distribution.
    gen = be.generate([DIST_PROMPT], SamplingParams(max_new_tokens=1, temperature=T_DIST, seed=5))[0]
    assert math.isclose(gen.logprobs[0], math.log(float(p[gen.token_ids[0]])), abs_tol=1e-5)


def test_top_k_50_is_a_different_distribution(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, first_token_probs: torch.Tensor
) -> None:
    """Why top_k=0 / top_p=1.0 must be explicit: HF's model.generate(do_sample=True) applies
    generation-config defaults (top_k=50), so its samples cannot come from softmax(logits / T) on a
    vocabulary of more than 50 tokens, and the log-probs training recomputes would not be those of
    the sampling distribution."""
    p = first_token_probs
    outside = torch.ones_like(p, dtype=torch.bool)
    outside[torch.topk(p, 50).indices] = False
    missing_mass = float(p[outside].sum())
    assert len(tok) > 50 and missing_mass > 0.05

    # Our backend with top_k=50: nothing outside the top 50, and a chi-square test rejects softmax/T.
    be = TransformersBackend(model, tok, batch_size=1000)
    counts = _first_token_counts(be, SamplingParams(max_new_tokens=1, temperature=T_DIST, top_k=50, seed=3))
    assert counts[outside].sum() == 0
    assert chisquare(counts.numpy(), (p * N_SAMPLES).numpy()).pvalue < 1e-6

    # HF's own sampler with its defaults does the same truncation.
    torch.manual_seed(0)
    with torch.no_grad():
        hf = model.generate(
            torch.tensor([DIST_PROMPT] * 2000),
            attention_mask=torch.ones(2000, 3, dtype=torch.long),
            do_sample=True,
            temperature=T_DIST,
            max_new_tokens=1,
            pad_token_id=0,
        )[:, -1]
    hf_counts = torch.bincount(hf, minlength=len(p)).double()
    assert hf_counts[outside].sum() == 0  # ~missing_mass * 2000 expected if it sampled softmax(l/T)


def test_truncate_top_k_and_top_p() -> None:
    probs = torch.tensor([[0.05, 0.4, 0.3, 0.15, 0.1]])
    assert torch.equal(truncate(probs, 2, 1.0), probs * torch.tensor([[0, 1, 1, 0, 0]]))
    # nucleus 0.7 keeps the smallest set reaching 0.7: {0.4, 0.3}; 0.71 needs 0.15 too.
    assert (truncate(probs, 0, 0.7) > 0).tolist() == [[False, True, True, False, False]]
    assert (truncate(probs, 0, 0.71) > 0).tolist() == [[False, True, True, True, False]]
    assert torch.equal(truncate(probs, 0, 1.0), probs)


def test_top_p_samples_stay_in_the_nucleus(
    backend: TransformersBackend, first_token_probs: torch.Tensor
) -> None:
    p = first_token_probs
    order = torch.argsort(p, descending=True)
    before = torch.cumsum(p[order], 0) - p[order]
    nucleus = set(order[before < 0.5].tolist())
    gens = backend.generate(
        [DIST_PROMPT] * 300, SamplingParams(max_new_tokens=1, temperature=T_DIST, top_p=0.5, seed=11)
    )
    assert {g.token_ids[0] for g in gens} <= nucleus
    # log-probs are still the full-vocabulary ones (the convention), not the renormalised nucleus.
    g = gens[0]
    assert math.isclose(g.logprobs[0], math.log(float(p[g.token_ids[0]])), abs_tol=1e-5)


# (d) -------------------------------------------------------------------------------------------
def _first_stop_index(tok: PreTrainedTokenizerFast, ids: list[int], stop: str) -> int:
    return next(k for k in range(len(ids)) if stop in tok.decode(ids[: k + 1]))


def test_stop_string_spanning_tokens(backend: TransformersBackend, tok: PreTrainedTokenizerFast) -> None:
    free = backend.generate([PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=0))[0]
    words = tok.convert_ids_to_tokens(free.token_ids)
    stop = f"{words[4]} {words[5]}"  # a two-token stop string taken from the greedy continuation
    expected = _first_stop_index(tok, free.token_ids, stop)
    gen = backend.generate([PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=0, stop=(stop,)))[0]
    assert gen.finish_reason == "stop" and gen.stop == stop
    assert gen.token_ids == free.token_ids[: expected + 1]  # the completing token is included
    assert gen.logprobs == free.logprobs[: expected + 1]


def test_stop_strings_ignore_the_prompt(backend: TransformersBackend, tok: PreTrainedTokenizerFast) -> None:
    prompt = tok.encode("w1 <search> w2 </search> w3")
    gen = backend.generate([prompt], SamplingParams(max_new_tokens=5, temperature=0, stop=("</search>",)))[0]
    assert len(gen.token_ids) >= 1
    assert "</search>" not in tok.decode(gen.token_ids[:-1])


def test_sampled_search_stops_at_close_tag(
    backend: TransformersBackend, tok: PreTrainedTokenizerFast
) -> None:
    close = tok.convert_tokens_to_ids("</search>")
    params = SamplingParams(max_new_tokens=40, temperature=3.0, stop=("</search>",), seed=0)
    gens = backend.generate([tok.encode("w1 <search>")] * 32, params)
    reasons = {g.finish_reason for g in gens}
    assert "stop" in reasons  # seeded: some sequences do produce </search>
    for g in gens:
        text = tok.decode(g.token_ids)
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == close and g.stop == "</search>" and text.endswith("</search>")
            assert "</search>" not in tok.decode(g.token_ids[:-1])
        elif g.finish_reason == "eos":
            assert g.token_ids[-1] == 1 and g.stop == 1 and "</search>" not in text
        else:
            assert len(g.token_ids) == 40 and g.stop is None and "</search>" not in text
    assert len({len(g.token_ids) for g in gens}) > 1  # each sequence stopped on its own


def test_eos_stop_token_and_length(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> None:
    be = TransformersBackend(model, tok)
    free = be.generate([PROMPTS[1]], SamplingParams(max_new_tokens=8, temperature=0))[0]
    assert free.finish_reason == "length" and free.stop is None and len(free.token_ids) == 8
    target = free.token_ids[3]
    k = free.token_ids.index(target)
    # an extra stop token id ends with "stop" and names the id
    gen = be.generate(
        [PROMPTS[1]], SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(target,))
    )[0]
    assert (gen.finish_reason, gen.stop, gen.token_ids) == ("stop", target, free.token_ids[: k + 1])
    # the model's generation_config EOS ids stop like the tokenizer's EOS, with "eos"
    model.generation_config.eos_token_id = [1, target]
    try:
        gen = TransformersBackend(model, tok).generate(
            [PROMPTS[1]], SamplingParams(max_new_tokens=8, temperature=0)
        )[0]
    finally:
        model.generation_config.eos_token_id = 1
    assert (gen.finish_reason, gen.stop, gen.token_ids) == ("eos", target, free.token_ids[: k + 1])


def test_sequences_in_a_batch_stop_independently(backend: TransformersBackend) -> None:
    free = backend.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0))
    stop_tok = free[2].token_ids[1]  # stops sequence 2 early, the others when (if) they meet it
    params = SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=(stop_tok,))
    batch = backend.generate(PROMPTS, params)
    for p, b in zip(PROMPTS, batch, strict=True):
        alone = backend.generate([p], params)[0]
        assert (b.token_ids, b.finish_reason, b.stop) == (alone.token_ids, alone.finish_reason, alone.stop)
    assert batch[2].finish_reason == "stop" and len(batch[2].token_ids) <= 2
    assert any(len(g.token_ids) == 10 for g in batch)


def test_same_results_without_cache_pruning(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> None:
    params = SamplingParams(max_new_tokens=30, temperature=3.0, stop=("</search>",), seed=0)
    prompts = [tok.encode("w1 <search>")] * 8
    pruned = TransformersBackend(model, tok).generate(prompts, params)
    keep = TransformersBackend(model, tok)
    keep.prune_finished = False
    kept = keep.generate(prompts, params)
    assert len({len(g.token_ids) for g in pruned}) > 1
    for a, b in zip(pruned, kept, strict=True):
        assert (a.token_ids, a.finish_reason, a.stop) == (b.token_ids, b.finish_reason, b.stop)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


# (e) -------------------------------------------------------------------------------------------
def test_same_seed_same_output(backend: TransformersBackend) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=123)
    a = backend.generate(PROMPTS, params)
    b = backend.generate(PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    c = backend.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=1.0, seed=124))
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_sequence_i_uses_seed_plus_i(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> None:
    """Batch composition and batch size do not change a seeded sequence's sample."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=40)
    batched = TransformersBackend(model, tok, batch_size=16).generate([PROMPTS[0]] * 4, params)
    for i, g in enumerate(batched):
        single = TransformersBackend(model, tok, batch_size=1).generate(
            [PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=1.0, seed=40 + i)
        )[0]
        assert g.token_ids == single.token_ids
    mixed = TransformersBackend(model, tok, batch_size=2).generate(PROMPTS, params)
    full = TransformersBackend(model, tok, batch_size=16).generate(PROMPTS, params)
    assert [g.token_ids for g in mixed] == [g.token_ids for g in full]


def test_unseeded_follows_torch_global_seed(backend: TransformersBackend) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    torch.manual_seed(5)
    a = backend.generate(PROMPTS, params)
    torch.manual_seed(5)
    b = backend.generate(PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


# (f) -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_batched_greedy_equals_alone(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, batch_size: int
) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0)
    be = TransformersBackend(model, tok, batch_size=batch_size)
    batched = be.generate(PROMPTS, params)
    for p, g in zip(PROMPTS, batched, strict=True):
        alone = be.generate([p], params)[0]
        assert g.token_ids == alone.token_ids
        assert max(abs(x - y) for x, y in zip(g.logprobs, alone.logprobs, strict=True)) < 1e-5


# loading, modes, errors --------------------------------------------------------------------------
def test_loads_from_a_local_directory(
    tmp_path, model: LlamaForCausalLM, tok: PreTrainedTokenizerFast
) -> None:  # noqa: ANN001
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    be = TransformersBackend(str(tmp_path), device="cpu", dtype="auto")
    assert be.dtype == torch.float32 and not be.model.training
    params = SamplingParams(max_new_tokens=6, temperature=0)
    assert (
        be.generate(PROMPTS, params)[0].token_ids
        == TransformersBackend(model, tok).generate(PROMPTS, params)[0].token_ids
    )


def test_training_mode_is_restored(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> None:
    model.train()
    try:
        TransformersBackend(model, tok).generate(
            [PROMPTS[0]], SamplingParams(max_new_tokens=2, temperature=0)
        )
        assert model.training
    finally:
        model.eval()


def test_errors(
    backend: TransformersBackend, model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, tmp_path
) -> None:  # noqa: ANN001
    with pytest.raises(RagrlError, match="not a local model directory"):
        TransformersBackend(tmp_path / "missing")
    with pytest.raises(RagrlError, match="tokenizer"):
        TransformersBackend(model)
    with pytest.raises(RagrlError, match="prompt 1 is empty"):
        backend.generate([[3], []], SamplingParams())
    with pytest.raises(RagrlError, match="max_prompt_len"):
        TransformersBackend(model, tok, max_prompt_len=4).generate([[3, 4, 5, 6, 7]], SamplingParams())
    with pytest.raises(RagrlError, match="unknown dtype"):
        TransformersBackend(model, tok, dtype="fp8")
    assert backend.generate([], SamplingParams()) == []


# vLLM ------------------------------------------------------------------------------------------
def test_vllm_sampling_kwargs() -> None:
    kw = vllm_sampling_kwargs(
        SamplingParams(max_new_tokens=9, temperature=0.7, stop=("</search>",), seed=1), 4
    )
    assert kw["top_k"] == -1 and kw["top_p"] == 1.0 and kw["max_tokens"] == 9 and kw["seed"] == 4
    assert kw["logprobs"] == 0 and kw["include_stop_str_in_output"] and kw["stop"] == ["</search>"]
    assert kw["repetition_penalty"] == 1.0 and kw["min_p"] == 0.0 and kw["skip_special_tokens"] is False
    assert vllm_sampling_kwargs(SamplingParams(top_k=20), None)["top_k"] == 20


def _completion(token_ids, finish_reason, stop_reason):  # noqa: ANN001, ANN202
    lps = [{t: SimpleNamespace(logprob=-0.5 * (i + 1))} for i, t in enumerate(token_ids)]
    return SimpleNamespace(
        token_ids=token_ids, logprobs=lps, finish_reason=finish_reason, stop_reason=stop_reason
    )


def test_vllm_output_mapping() -> None:
    params = SamplingParams(stop=("</search>",), stop_token_ids=(7,))
    g = to_generation(_completion([5, 6, 94], "stop", "</search>"), params, (1,))
    assert (g.token_ids, g.logprobs, g.finish_reason, g.stop) == (
        [5, 6, 94],
        [-0.5, -1.0, -1.5],
        "stop",
        "</search>",
    )
    g = to_generation(_completion([5, 7], "stop", 7), params, (1,))
    assert (g.finish_reason, g.stop) == ("stop", 7)
    g = to_generation(_completion([5, 1], "stop", None), params, (1,))
    assert (g.finish_reason, g.stop) == ("eos", 1)
    g = to_generation(_completion([5, 2], "stop", 2), params, (1, 2))  # a generation_config EOS id
    assert (g.finish_reason, g.stop) == ("eos", 2)
    g = to_generation(_completion([5, 6], "length", None), params, (1,))
    assert (g.finish_reason, g.stop) == ("length", None)
    assert g.metadata["truncated"] is False
    assert to_generation(_completion([5], "length", None), SamplingParams(top_k=5), (1,)).metadata[
        "truncated"
    ]


def test_vllm_backend_without_vllm_names_the_extra() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        from ragrl.llm.vllm_backend import VLLMBackend

        with pytest.raises(RagrlError, match=r"pip install 'ragrl\[vllm\]'"):
            VLLMBackend("/nonexistent")
    else:
        pytest.skip("vllm is installed")
