"""KV caches for the transformers backend.

* ``new_cache(model)``: an empty cache whose layers grow by doubling and write each step's keys and
  values in place, instead of transformers' ``DynamicLayer`` concatenating (copying) the whole cache at
  every step, which makes a long generation quadratic in memory traffic. Used for models whose layers are
  all plain full attention; others keep their own default cache.
* ``PrefixCache``: when a sequence finishes, the KV cache of its tokens (prompt + generation, but the
  last token) is kept, up to ``prefix_cache_mb`` MB, least recently stored evicted first. A later prompt
  that extends a kept sequence (the next turn of a rollout: the same tokens plus the last generated
  token and an observation) reuses it and prefills only its new tokens, so a turn does not recompute the
  whole context. Rows with and without a hit share a batch (``TransformersBackend._resume``): each row's
  cache is left-padded to the longest one and its new tokens are left-padded after it; the attention
  mask hides both gaps and position ids come from the mask, so logits are those of a full prefill (to
  float rounding). A hit is used once. Any in-place change of the model's parameters (an optimizer step,
  ``load_state_dict``) empties the cache, as does ``TransformersBackend.clear_prefix_cache()``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch


def growing_layer_class() -> type:
    """A transformers ``DynamicLayer`` whose storage grows by doubling: a decoding step writes its key
    and value in place instead of concatenating (copying) the whole cache every step."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        _k: torch.Tensor | None = None
        _v: torch.Tensor | None = None
        _n = 0

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            if self._k is None or self.keys.data_ptr() != self._k.data_ptr():
                self._n = self.keys.shape[-2] if self.keys.numel() else 0
                self._k = self._v = None
            new = key_states.shape[-2]
            if self._k is None or self._n + new > self._k.shape[-2]:
                capacity = max(2 * (self._n + new), 64)
                k = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[-1]))
                v = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[-1]))
                if self._n:
                    k[:, :, : self._n] = self.keys
                    v[:, :, : self._n] = self.values
                self._k, self._v = k, v
            self._k[:, :, self._n : self._n + new] = key_states
            self._v[:, :, self._n : self._n + new] = value_states
            self._n += new
            self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self._k is not None and self._n:
                self._k, self._v = self._k.index_select(0, indices), self._v.index_select(0, indices)
                self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]
            else:
                super().batch_select_indices(indices)

    return GrowingLayer


def new_cache(model: Any) -> Any:
    """An empty KV cache of growing layers, or ``None`` (the model's own default cache) for models whose
    layers are not all plain full attention (sliding-window, linear or recurrent layers)."""
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or []
    sliding = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
    if sliding or any(t != "full_attention" for t in layer_types):
        return None
    try:
        from transformers.cache_utils import Cache

        return Cache(layer_class_to_replicate=growing_layer_class())
    except (ImportError, TypeError):  # transformers without layered caches
        return None


class PrefixCache:
    """Kept KV caches of finished sequences, keyed by their token ids (see the module docstring)."""

    def __init__(self, budget_mb: float) -> None:
        self.budget = int(budget_mb * 2**20)
        self.entries: OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], int]] = (
            OrderedDict()
        )
        self.lengths: dict[int, int] = {}  # key length -> number of entries with that length
        self.nbytes = 0
        self.weights_version: int | None = None
        self.hits = 0
        self.hit_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def clear(self) -> None:
        self.entries.clear()
        self.lengths.clear()
        self.nbytes = 0

    def check_weights(self, model: Any) -> None:
        """Forget everything when any parameter changed in place since the last call."""
        version = sum(p._version for p in model.parameters())
        if version != self.weights_version:
            self.clear()
            self.weights_version = version

    def _pop(self, key: tuple[int, ...]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        layers, nbytes = self.entries.pop(key)
        self.nbytes -= nbytes
        self.lengths[len(key)] -= 1
        if not self.lengths[len(key)]:
            del self.lengths[len(key)]
        return layers, nbytes

    def put(self, tokens: list[int], cache: Any, row: int, mask_row: torch.Tensor) -> None:
        if not tokens or not hasattr(cache, "layers"):
            return
        keep = mask_row.bool().nonzero().squeeze(-1)
        if keep.numel() != len(tokens):
            return  # the cache does not line up with the tokens (e.g. a model with its own cache layout)
        layers = [
            (layer.keys[row].index_select(1, keep), layer.values[row].index_select(1, keep))
            for layer in cache.layers
        ]
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.budget:
            return
        key = tuple(tokens)
        if key in self.entries:
            self._pop(key)
        self.entries[key] = (layers, nbytes)
        self.lengths[len(key)] = self.lengths.get(len(key), 0) + 1
        self.nbytes += nbytes
        while self.nbytes > self.budget:
            self._pop(next(iter(self.entries)))

    def take(self, prompt: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None:
        """The longest kept prefix of ``prompt`` (removed from the cache), leaving at least one new token."""
        for n in sorted(self.lengths, reverse=True):
            if n > len(prompt):
                continue
            key = tuple(prompt[:n])
            if key in self.entries:
                layers, _ = self._pop(key)
                if n == len(prompt):  # nothing new to feed: give back the last position to recompute
                    n -= 1
                    if n == 0:
                        return None
                    layers = [(k[:, :n], v[:, :n]) for k, v in layers]
                self.hits += 1
                self.hit_tokens += n
                return n, layers
        return None
