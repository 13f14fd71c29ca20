"""Decoding over static key/value buffers (``decode="static"``, the step a GPU replays as a CUDA graph)
gives the plain loop's tokens and, to float rounding, its log-probs: Llama (SmolLM2, the tiny policy)
and Qwen2 (with q/k/v biases and grouped KV heads), greedy and sampled, with stop strings, EOS, rows
that finish early and the prefix cache's second turn."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ragrl.errors import RagrlError
from ragrl.llm.backend import SamplingParams
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.llm.kv_cache import new_cache
from ragrl.llm.logprobs import cache_keyword, pad_batch, position_ids_from_mask
from ragrl.llm.static_decode import StaticDecoder, unsupported_reason

_spec = importlib.util.spec_from_file_location("tiny_models", Path(__file__).parent / "tiny_models.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

VOCAB = tiny.VOCAB
PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16, 17], [20], [21, 22, 23]]
OBS = [[40, 41, 42], [43], [44, 45, 46, 47, 48], [49, 50], [51]]
tokenizer = tiny.word_tokenizer


def llama(attention: str = "sdpa") -> LlamaForCausalLM:
    """Three layers, grouped KV heads (4 heads, 2 KV heads)."""
    return tiny.llama(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, attn_implementation=attention
    )


def qwen2() -> Qwen2ForCausalLM:
    """One KV head for four heads, tied embeddings."""
    return tiny.qwen2(seed=1, num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)


MODELS = {"llama": llama, "llama-eager": lambda: llama("eager"), "qwen2": qwen2}


def assert_same(a, b, atol=1e-4) -> None:  # noqa: ANN001
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert (x.finish_reason, x.stop) == (y.finish_reason, y.stop)
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_decoding_gives_the_loops_generations(name: str, temperature: float) -> None:
    model, tok = MODELS[name](), tokenizer()
    params = SamplingParams(max_new_tokens=12, temperature=temperature, seed=3, stop=["w7 w8"])
    loop = TransformersBackend(model, tok, batch_size=4, decode="loop").generate(PROMPTS, params)
    static = TransformersBackend(model, tok, batch_size=4, decode="static").generate(PROMPTS, params)
    assert_same(static, loop)
    assert {g.metadata["decode"] for g in static} == {"static"}
    assert {g.metadata["decode"] for g in loop} == {"loop"}


@pytest.mark.parametrize("name", ["llama", "llama-eager"])
def test_static_decoding_under_accelerates_mixed_precision(name: str) -> None:
    """fp32 weights prepared by accelerate for bf16 mixed precision (``train.mixed_precision=bf16``, as
    the trainers do): the prepared forward enters autocast, so the prefill's values are bf16, and the
    static step, which calls the decoder's layers directly, must enter the same autocast. Without it
    the step wrote fp32 values into bf16 buffers and raised (the first H200 run, 2026-11-29: every
    seed's warm-start evaluation). Greedy, the loop's tokens, with its log-probs to bf16 rounding.
    The forward is wrapped as ``Accelerator.prepare`` wraps it (an ``Accelerator`` here would fix the
    process's mixed precision for every later test)."""
    model = MODELS[name]()
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    assert next(model.parameters()).dtype == torch.float32
    tok, params = tokenizer(), SamplingParams(max_new_tokens=12, temperature=0.0, seed=3)
    loop = TransformersBackend(model, tok, batch_size=4, decode="loop").generate(PROMPTS, params)
    static = TransformersBackend(model, tok, batch_size=4, decode="static").generate(PROMPTS, params)
    assert_same(static, loop, atol=3e-2)
    assert {g.metadata["decode"] for g in static} == {"static"}
    decoder, _, _ = prefill(model, PROMPTS, steps=4)
    assert decoder.autocast_dtype == torch.bfloat16
    assert prefill(MODELS[name](), PROMPTS, steps=4)[0].autocast_dtype is None  # plain fp32: no autocast


def test_rows_that_finish_early_and_eos() -> None:
    """Rows stopped by EOS, a stop token or the length at different steps: the static step keeps feeding
    them (its shapes are fixed) and their generations do not change."""
    model, tok = llama(), tokenizer()
    probe = TransformersBackend(model, tok, decode="loop").generate(
        PROMPTS, SamplingParams(max_new_tokens=10, temperature=0)
    )
    stop_ids = [g.token_ids[i] for i, g in zip([1, 3, 5], probe, strict=False)]  # hit at different steps
    params = SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=stop_ids)
    loop = TransformersBackend(model, tok, decode="loop").generate(PROMPTS, params)
    static = TransformersBackend(model, tok, decode="static").generate(PROMPTS, params)
    assert_same(static, loop)
    lengths = {len(g.token_ids) for g in static}
    assert len(lengths) > 1 and any(g.finish_reason == "stop" for g in static)


def test_a_lora_policy() -> None:
    """A peft LoRA policy (the trainer's ``train.model.lora``): its adapters, unmerged, are in the layers the
    static step runs, so it decodes what the loop decodes."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # adapters that change the logits (peft starts lora_B at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    tok = tokenizer()
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=2)
    static = TransformersBackend(model, tok, decode="static").generate(PROMPTS, params)
    assert_same(static, TransformersBackend(model, tok, decode="loop").generate(PROMPTS, params))
    base = TransformersBackend(model.get_base_model(), tok, decode="loop")
    with model.disable_adapter():
        plain = base.generate(PROMPTS, params)
    assert [g.token_ids for g in plain] != [g.token_ids for g in static]  # the adapters did count


def test_the_prefix_caches_second_turn() -> None:
    """A finished row's buffers go into the prefix cache and the next turn resumes from them exactly as
    from the loop's cache (the same hits, the same tokens)."""
    model, tok = qwen2(), tokenizer()
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)

    def two_turns(backend: TransformersBackend) -> list:
        first = backend.generate(PROMPTS, params)
        nxt = [p + g.token_ids + o for p, g, o in zip(PROMPTS, first, OBS, strict=True)] + [[30, 31, 32]]
        return first + backend.generate(nxt, params)

    loop, static = (
        TransformersBackend(model, tok, decode="loop"),
        TransformersBackend(model, tok, decode="static"),
    )
    plain = TransformersBackend(model, tok, decode="loop", prefix_cache_mb=0)
    a, b, c = two_turns(static), two_turns(loop), two_turns(plain)
    assert static.prefix_cache.hits == loop.prefix_cache.hits == len(PROMPTS)
    assert static.prefix_cache.hit_tokens == loop.prefix_cache.hit_tokens
    assert_same(a, b)
    assert_same(a, c)


def prefill(model, prompts: list[list[int]], steps: int) -> tuple[StaticDecoder, torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """A ``StaticDecoder`` after the model's own prefill of ``prompts`` (and the prefill's inputs)."""
    ids, mask = pad_batch(prompts, 0, "left", device=torch.device("cpu"))
    pos = position_ids_from_mask(mask)
    key = cache_keyword(model)
    with torch.no_grad():
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{key: new_cache(model)}
        )
    return StaticDecoder(model, out[key], mask, pos, steps=steps), ids, mask


def test_one_step_equals_the_models_forward() -> None:
    """The static step's logits are the model's own forward over the whole left-padded sequence."""
    model = llama()
    decoder, ids, mask = prefill(model, [[3, 4, 5, 6], [7, 8]], steps=3)
    fed = torch.tensor([9, 10])
    with torch.no_grad():
        decoder.feed(fed)
        logits = decoder.step()
        full_ids = torch.cat([ids, fed[:, None]], 1)
        full_mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
        want = model(
            input_ids=full_ids, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)
        )
    assert torch.allclose(logits, want.logits[:, -1], atol=1e-5)
    assert int(decoder.column) == ids.shape[1] + 1


def test_which_models_and_modes() -> None:
    model, tok = llama(), tokenizer()
    assert unsupported_reason(model) is None and unsupported_reason(qwen2()) is None
    # auto: the plain loop on a CPU (graphs are a GPU's); an explicit graph on a CPU is an error
    auto = TransformersBackend(model, tok).generate([[3, 4]], SamplingParams(max_new_tokens=2, temperature=0))
    assert auto[0].metadata["decode"] == "loop"
    with pytest.raises(RagrlError, match="needs a CUDA device"):
        TransformersBackend(model, tok, decode="graph").generate([[3, 4]], SamplingParams(max_new_tokens=2))
    with pytest.raises(RagrlError, match="decode='fast'"):
        TransformersBackend(model, tok, decode="fast")
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(VOCAB), n_embd=16, n_layer=1, n_head=2))
    assert "model type 'gpt2'" in unsupported_reason(gpt2)
    with pytest.raises(RagrlError, match="model type 'gpt2'"):
        TransformersBackend(gpt2, tok, decode="static").generate([[3, 4]], SamplingParams(max_new_tokens=2))
    sliding = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(VOCAB),
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=0,
        )
    )
    assert "full attention" in unsupported_reason(sliding)


def test_fsdp_is_not_supported(one_process_group) -> None:  # noqa: ANN001
    """FSDP2's hooks gather the weights inside each layer's forward (collectives a graph cannot hold):
    ``auto`` decodes such a policy with the loop, even while its weights are gathered for generation."""
    from torch.distributed.fsdp import fully_shard

    model = llama()
    fully_shard(model)
    reason = unsupported_reason(model)
    assert reason == "the weights are sharded (FSDP's hooks gather them inside the forward)"
    model.unshard()  # as ragrl's generation context does: plain tensors, the hooks still there
    assert "sharded" in unsupported_reason(model)
