"""Tiny random causal LMs and a word-level tokenizer over their vocabulary, for the backend tests (loaded
by file path, as ``tests/rollout/scripted_world.py`` is)."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

VOCAB = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(60)}}
"""Pad 0, EOS 1, then the words ``w0`` ... ``w59`` (ids 3 to 62)."""


def word_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _config(**shape: Any) -> dict[str, Any]:
    """Two layers and two heads unless ``shape`` says otherwise."""
    return {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "vocab_size": len(VOCAB),
        "hidden_size": 32,
        "intermediate_size": 64,
        "max_position_embeddings": 256,
        "initializer_range": 0.2,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": None,
        **shape,
    }


def llama(seed: int = 0, **shape: Any) -> LlamaForCausalLM:
    """A random Llama (2 layers, 2 heads unless ``shape`` says otherwise), in eval mode."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**_config(**shape))).eval()


def qwen2(seed: int = 0, **shape: Any) -> Qwen2ForCausalLM:
    """A random Qwen2 (q/k/v biases; 2 layers, 2 heads unless ``shape`` says otherwise), in eval mode."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**_config(**shape))).eval()
