"""The transformers backend's prefix cache: a later turn that extends a finished sequence reuses its
KV cache and gets the same tokens and (to float rounding) the same log-probs as a full prefill."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from ragrl.llm.backend import SamplingParams
from ragrl.llm.hf_backend import TransformersBackend

_spec = importlib.util.spec_from_file_location("tiny_models", Path(__file__).parent / "tiny_models.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


def _setup():
    return tiny.llama(), tiny.word_tokenizer()


PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16, 17], [20]]
OBS = [[40, 41, 42], [43], [44, 45, 46, 47, 48], [49, 50]]


def _two_turns(backend, params):
    first = backend.generate(PROMPTS, params)
    nxt = [p + g.token_ids + o for p, g, o in zip(PROMPTS, first, OBS, strict=True)]
    nxt.append([30, 31, 32])  # a fresh prompt in the same batch: no hit
    return first, backend.generate(nxt, params)


def test_second_turn_reuses_the_cache_and_matches_a_full_prefill():
    model, tok = _setup()
    params = SamplingParams(max_new_tokens=6, temperature=0)
    cached = TransformersBackend(model, tok, batch_size=3)
    plain = TransformersBackend(model, tok, batch_size=3, prefix_cache_mb=0)
    first_c, second_c = _two_turns(cached, params)
    first_p, second_p = _two_turns(plain, params)
    assert cached.prefix_cache.hits == len(PROMPTS) and plain.prefix_cache.hits == 0
    assert cached.prefix_cache.hit_tokens == sum(
        len(p) + len(g.token_ids) - 1 for p, g in zip(PROMPTS, first_c, strict=True)
    )
    for a, b in zip(first_c + second_c, first_p + second_p, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_sampled_turns_match_too():
    model, tok = _setup()
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
    _, second_c = _two_turns(TransformersBackend(model, tok), params)
    _, second_p = _two_turns(TransformersBackend(model, tok, prefix_cache_mb=0), params)
    assert [g.token_ids for g in second_c] == [g.token_ids for g in second_p]


def test_weight_updates_and_the_budget_empty_the_cache():
    model, tok = _setup()
    backend = TransformersBackend(model, tok)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    first = backend.generate(PROMPTS, params)
    assert len(backend.prefix_cache.entries) == len(PROMPTS)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)  # an optimizer step changes the weights in place
    backend.generate([PROMPTS[0] + first[0].token_ids], params)
    assert backend.prefix_cache.hits == 0  # the stale entries were dropped, not used

    tiny = TransformersBackend(model, tok, prefix_cache_mb=0.001)  # about 1 KB: one short entry at most
    tiny.generate(PROMPTS, params)
    assert tiny.prefix_cache.nbytes <= tiny.prefix_cache.budget
    assert len(tiny.prefix_cache.entries) <= 1


def test_a_prompt_equal_to_a_kept_sequence_recomputes_its_last_position():
    model, tok = _setup()
    params = SamplingParams(max_new_tokens=3, temperature=0)
    backend = TransformersBackend(model, tok)
    first = backend.generate([PROMPTS[2]], params)[0]
    again = PROMPTS[2] + first.token_ids[:-1]  # exactly the kept key
    reused = backend.generate([again], params)[0]
    fresh = TransformersBackend(model, tok, prefix_cache_mb=0).generate([again], params)[0]
    assert backend.prefix_cache.hits == 1
    assert reused.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(reused.logprobs), torch.tensor(fresh.logprobs), atol=1e-5)
