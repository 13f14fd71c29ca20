"""The vLLM backend: its weight packing everywhere; with the real engine (``make test-vllm``, its own
virtualenv with vllm-cpu), greedy tokens equal the transformers backend's, its log-probs are the
training recompute's, and weights loaded into it take effect at once."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from ragrl.llm.backend import SamplingParams
from ragrl.llm.hf_backend import TransformersBackend, load_tokenizer
from ragrl.llm.logprobs import pad_batch, token_logprobs
from ragrl.llm.vllm_backend import pack_weights, unpack_weights
from ragrl.train.reader import SHIPPED_BASE


def test_weights_cross_as_bytes_bit_for_bit_in_every_dtype() -> None:
    torch.manual_seed(0)
    named = [
        ("a.weight", torch.randn(3, 5)),
        ("b.weight", torch.randn(4, dtype=torch.float64)),
        ("c.weight", torch.randn(2, 3).to(torch.bfloat16)),
        ("d.ids", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
        ("e.empty", torch.zeros(0, 4)),
        ("f.view", torch.randn(6, 4).t()),  # not contiguous
    ]
    names, blobs = pack_weights(named)
    assert names == [n for n, _ in named] and all(isinstance(b[0], bytes) for b in blobs)
    for (name, t), (name2, u) in zip(named, unpack_weights(names, blobs), strict=True):
        assert name == name2 and u.dtype == t.dtype and u.shape == t.shape and torch.equal(u, t)
    # cast to the engine's dtype on the way: floats only, integers kept
    names, blobs = pack_weights(named, torch.bfloat16)
    back = dict(unpack_weights(names, blobs))
    assert back["a.weight"].dtype == torch.bfloat16 and torch.equal(back["a.weight"], named[0][1].bfloat16())
    assert back["d.ids"].dtype == torch.int64
    with pytest.raises(Exception, match="unknown dtype 'float7'"):
        unpack_weights(["x"], [(b"\0\0\0\0", "float7", [1])])


# the real engine --------------------------------------------------------------------------------
PROMPTS = [[5, 9, 14, 20], [7, 3], [11, 12, 13, 14, 15, 16], [30]]


@pytest.fixture(scope="module")
def engine():  # noqa: ANN201
    pytest.importorskip("vllm")
    from ragrl.llm.vllm_backend import VLLMBackend

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default takes most of the RAM
    options = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512}
    if torch.cuda.is_available():
        options["gpu_memory_utilization"] = 0.3
    backend = VLLMBackend(str(SHIPPED_BASE), **options)
    yield backend
    backend.close()


@pytest.fixture()
def base() -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(SHIPPED_BASE, dtype=torch.float32).eval()


def reference(model) -> TransformersBackend:  # noqa: ANN001
    return TransformersBackend(model, load_tokenizer(SHIPPED_BASE), prefix_cache_mb=0)


@pytest.mark.vllm
def test_greedy_tokens_equal_the_transformers_backend(engine, base) -> None:  # noqa: ANN001
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    ours = reference(base).generate(PROMPTS, params)
    theirs = engine.generate(PROMPTS, params)
    assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]
    for a, b in zip(theirs, ours, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3


@pytest.mark.vllm
def test_logprobs_are_the_training_recompute_at_every_temperature(engine, base) -> None:  # noqa: ANN001
    for temperature in (0.0, 1.0, 0.7):
        gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=temperature, seed=3))
        seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens, strict=True)]
        ids, mask = pad_batch(seqs, 0, "right")
        with torch.no_grad():
            lp = token_logprobs(base, ids, mask, temperature=temperature or 1.0)
        for b, (p, g) in enumerate(zip(PROMPTS, gens, strict=True)):
            ref = lp[b, len(p) - 1 : len(p) - 1 + len(g.token_ids)]
            assert float((ref - torch.tensor(g.logprobs)).abs().max()) < 1e-3


@pytest.mark.vllm
def test_loaded_weights_take_effect_and_can_be_put_back(engine, base) -> None:  # noqa: ANN001
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    before = [g.token_ids for g in engine.generate(PROMPTS, params)]
    changed = AutoModelForCausalLM.from_pretrained(SHIPPED_BASE, dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert engine.load_weights(changed.state_dict().items()) > 0
    after = engine.generate(PROMPTS, params)
    expected = reference(changed).generate(PROMPTS, params)
    assert [g.token_ids for g in after] == [g.token_ids for g in expected] != before
    engine.load_weights(base.state_dict().items())
    assert [g.token_ids for g in engine.generate(PROMPTS, params)] == before


@pytest.mark.vllm
def test_many_long_seeded_prompts_sample_and_repeat(engine) -> None:  # noqa: ANN001
    """More prompt tokens than one engine step takes, each request seeded: on the CPU build a chunked
    prefill would re-wind a CPU generator and stop the engine (``CPU Generator does not use offset``),
    so ``VLLMBackend`` turns chunked prefill off there. The same seeds give the same tokens."""
    torch.manual_seed(0)
    prompts = [torch.randint(5, 8000, (400,)).tolist() for _ in range(64)]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=11)
    first = [g.token_ids for g in engine.generate(prompts, params)]
    assert len(first) == 64 and all(len(t) == 4 for t in first)
    assert [g.token_ids for g in engine.generate(prompts, params)] == first


@pytest.mark.vllm
def test_a_cached_prompt_prefix_goes_with_the_old_weights(engine, base) -> None:  # noqa: ANN001
    """vLLM caches prompt prefixes by blocks (128 tokens on the CPU build): after a weight load the
    cached keys and values of a shared prefix would be the old weights'; ``load_weights`` drops them."""
    torch.manual_seed(2)
    prefix = torch.randint(5, 8000, (300,)).tolist()
    prompts = [[*prefix, 11, 12], [*prefix, 13]]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    engine.generate(prompts, params)  # the prefix is cached now
    changed = AutoModelForCausalLM.from_pretrained(SHIPPED_BASE, dtype=torch.float32).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights(changed.state_dict().items())
    theirs = engine.generate(prompts, params)
    ours = reference(changed).generate(prompts, params)
    assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]
    for a, b in zip(theirs, ours, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3
    engine.load_weights(base.state_dict().items())
