"""The backend's growing KV cache gives the logits of plain forward passes, on more than one model
family, and steps aside for models whose layers are not all full attention."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import MistralConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ragrl.llm.backend import SamplingParams
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.llm.kv_cache import new_cache


def _tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(40)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def test_qwen2_greedy_generation_equals_step_by_step_forward_passes():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=43,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    assert new_cache(model) is not None
    prompts = [[3, 4, 5, 6], [7, 8]]
    gens = TransformersBackend(model, _tokenizer(), prefix_cache_mb=0).generate(
        prompts,
        SamplingParams(max_new_tokens=70, temperature=0),  # past the first capacity doubling (64)
    )
    for prompt, gen in zip(prompts, gens, strict=True):
        seq = list(prompt)
        with torch.no_grad():
            for token, lp in zip(gen.token_ids, gen.logprobs, strict=True):
                logits = model(torch.tensor([seq])).logits[0, -1]
                assert token == int(logits.argmax())
                assert abs(lp - float(torch.log_softmax(logits, -1)[token])) < 1e-5
                seq.append(token)


def test_sliding_window_models_keep_their_own_cache():
    from transformers import MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=43,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        sliding_window=8,
    )
    assert new_cache(MistralForCausalLM(cfg)) is None
