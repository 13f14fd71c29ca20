"""Language models: the generation-backend protocol, its transformers and vLLM implementations, the
training-side log-prob function and the tiny-policy builder.

Heavy modules (torch, transformers, vLLM) are imported on first use of the names that need them.
"""

from importlib import import_module
from typing import Any

from ragrl.llm.backend import Generation, GenerationBackend, SamplingParams

_LAZY = {
    "TransformersBackend": "ragrl.llm.hf_backend",
    "VLLMBackend": "ragrl.llm.vllm_backend",
    "token_logprobs": "ragrl.llm.logprobs",
    "pad_batch": "ragrl.llm.logprobs",
    "DEFAULT_TAGS": "ragrl.llm.tiny",
    "TinyConfig": "ragrl.llm.tiny",
    "build_tiny_model": "ragrl.llm.tiny",
    "create_tiny_policy": "ragrl.llm.tiny",
    "train_tokenizer": "ragrl.llm.tiny",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ragrl.llm' has no attribute {name!r}")


__all__ = ["Generation", "GenerationBackend", "SamplingParams", *_LAZY]
