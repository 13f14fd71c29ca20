"""Prompt messages to token ids: the tokenizer's chat template when it has one, plain text otherwise.

Protocols (``ragrl.rollout.protocol``) and LLM judges (``ragrl.metrics.judge``) encode their messages here,
so a prompt is encoded the same way wherever it is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """The plain-text prompt used when a tokenizer has no chat template: message contents joined by a
    blank line (no role names, nothing model-specific)."""
    return "\n\n".join(m["content"] for m in messages if m.get("content"))


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_messages(messages: list[dict[str, str]], tokenizer: Any) -> list[int]:
    """Token ids of ``messages`` ready for generation.

    With a chat template: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
    (tokenized by the template call itself). Without one: ``render_plain(messages)`` encoded once with
    the tokenizer's default special tokens (a BOS where the model uses one).
    """
    if has_chat_template(tokenizer):
        out = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(out, Mapping) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        ids = list(out)
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
        return [int(t) for t in ids]
    return list(tokenizer.encode(render_plain(messages), add_special_tokens=True))
