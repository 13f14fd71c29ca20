"""Decoding over static key/value buffers, replayed as one CUDA graph on a GPU.

Why: a small model decoding a few hundred rows on a GPU spends its decoding step launching kernels and
running Python, not computing. The second GPU run measured SmolLM2-135M (30 layers) at 256 rows: ragrl's
decoding step took 93 ms and ``model.generate``'s 51 ms. The step is about 1,750 torch operations
(``benchmarks/decode_overhead.py``), and its memory traffic, mostly the key/value cache, is a few
gigabytes (an estimate, not a measurement: milliseconds on an H200). A CUDA graph records the step's
kernels once and replays them with one launch.

How (``StaticDecoder``): the prefill is the model's own forward, exactly as in the plain loop (and
``TransformersBackend._resume`` for rows that continue a kept prefix). Its KV cache is then copied into
one buffer per layer, ``[rows, kv heads, prefill + the steps left (rounded up to 16), head dim]``, and
every later step feeds one token per row through the model's own decoder layers:

* the step writes each layer's new key and value at ``column`` (the same column for every row: rows are
  left-padded, so they advance together) and attends over the whole buffer through an additive mask
  that hides the prompt's padding and the columns not yet written (``attend``, unhidden one column a
  step, in place);
* rotary positions come from ``position`` (per row, the prompt's last position + 1, then + 1 a step);
* ``column`` and ``position`` advance in place, on the device.

Every tensor the step reads or writes keeps its shape and address for the whole call, and nothing in it
waits on the CPU, so on CUDA (``CudaGraphStep``) the first step runs eagerly, the second is recorded into
a graph and every later one is a replay. The graph is checked once a call: the second step runs eagerly
first, with any wait on the CPU made an error (a step that waits cannot be recorded), the state is put
back, the step is recorded (recording must not run it: the column must not move), the graph replays it
into logits set to NaN first, and the column must then have moved by one and the logits must agree with
the eager step's (relative L2 error ``GRAPH_TOLERANCE``). A graph that fails is dropped, the state is
left as the eager step left it, the call goes on eagerly, the generations' metadata say why, and the
backend records no graph again (``GraphRecorder``). Rows that finish keep being fed (the graph's shapes
are fixed); their outputs are ignored.

Supported: plain full-attention decoders whose layers take ``position_embeddings`` from the model's
``rotary_emb`` and whose embeddings are not scaled (``SUPPORTED_MODEL_TYPES``: Llama, so SmolLM2 and the
tiny policy; Qwen2 / Qwen2.5; Qwen3; Mistral without a sliding window), with ``sdpa`` or ``eager``
attention, layers that take the cache as ``cache`` or ``past_key_values``, and no FSDP (its hooks gather
the weights inside the forward). Anything else decodes with the plain loop (``unsupported_reason`` says
why).
"""

from __future__ import annotations

from typing import Any

import torch

from ragrl.llm.kv_cache import new_cache
from ragrl.llm.logprobs import forward_cache_keyword

__all__ = [
    "GRAPH_TOLERANCE",
    "SUPPORTED_MODEL_TYPES",
    "CudaGraphStep",
    "GraphRecorder",
    "StaticDecoder",
    "unsupported_reason",
]

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
GRAPH_TOLERANCE = 1e-2
"""Largest relative L2 error ``|graph - eager| / |eager|`` of a checked step's logits."""


def _base(model: Any) -> Any:
    """The causal LM under a PEFT wrapper (its LoRA layers stay in place), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot decode over static buffers, or ``None`` when it can."""
    base = _base(model)
    config = getattr(base, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
    if new_cache(base) is None:
        return "not every layer is full attention (sliding-window or other layers)"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"attention implementation {attention!r} (sdpa or eager take an additive mask)"
    if _sharded(base):
        return "the weights are sharded (FSDP's hooks gather them inside the forward)"
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if decoder is None or not all(
        hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")
    ):
        return "the model has no decoder with embed_tokens, layers, norm and rotary_emb"
    if forward_cache_keyword(decoder.layers[0].forward) is None:
        return "its decoder layers take the KV cache under neither 'cache' nor 'past_key_values'"
    return None


def _sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP holds any of ``model``'s modules (FSDP2's ``FSDPModule``) or parameters (DTensors)."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules()) or any(
        isinstance(p, DTensor) for p in model.parameters()
    )


class _Slots:
    """What a layer's attention sees as its cache: ``update`` writes the fed token's key and value into the
    layer's buffer at ``column`` and returns the whole buffer (``attend`` hides what is not written)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], column: torch.Tensor) -> None:
        self.keys, self.values, self.column = keys, values, column

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[layer_idx].index_copy_(2, self.column, key_states)
        self.values[layer_idx].index_copy_(2, self.column, value_states)
        return self.keys[layer_idx], self.values[layer_idx]


class _Layer:
    """One layer of the buffers as far as they are written (``PrefixCache.put`` reads ``.layers``)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class _View:
    def __init__(self, layers: list[_Layer]) -> None:
        self.layers = layers


class StaticDecoder:
    """One call's decoding state over static buffers (see the module docstring).

    ``cache``: the prefill's KV cache (``.layers[i].keys`` / ``.values``, ``[rows, kv heads, width, dim]``);
    ``attention_mask``: the prefill's ``[rows, width]`` mask; ``position_ids``: its ``[rows, width']``
    positions (the last column is each row's last position); ``steps``: the tokens each row may still be
    fed (the call's ``max_new_tokens`` - 1: the prefill gave the first).
    """

    def __init__(
        self, model: Any, cache: Any, attention_mask: torch.Tensor, position_ids: torch.Tensor, steps: int
    ) -> None:
        base = _base(model)
        self.decoder = base.get_decoder()
        self.lm_head = base.get_output_embeddings()
        self.layers = list(self.decoder.layers[: base.config.num_hidden_layers])
        self.cache_keyword = forward_cache_keyword(self.layers[0].forward) or "past_key_values"
        rows, width = attention_mask.shape
        self.width = width
        """The prefill's columns."""
        # a multiple of 16 columns: SDPA's memory-efficient kernel wants its mask's rows aligned so (else it
        # copies the mask into a padded one in every layer); the columns past the end stay hidden
        total = -(-(width + steps) // 16) * 16
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for layer in cache.layers:
            for prefill, out in ((layer.keys, keys), (layer.values, values)):
                buffer = prefill.new_zeros((rows, prefill.shape[1], total, prefill.shape[-1]))
                buffer[:, :, :width] = prefill
                out.append(buffer)
        device, dtype = keys[0].device, keys[0].dtype
        self.keys, self.values = keys, values
        computed = values[0].dtype  # the keys may be wider: rotary embeddings in fp32 promote them
        weights = next(self.layers[0].parameters()).dtype
        self.autocast_dtype = computed if computed != weights else None
        """The dtype the prefill computed in when it differs from the weights': the prefill ran under
        autocast (accelerate's prepared forward enters it for ``train.mixed_precision``), and the step
        calls the decoder's layers directly, outside that forward, so it enters the same autocast."""
        self.attend = torch.full((rows, 1, 1, total), torch.finfo(dtype).min, dtype=dtype, device=device)
        self.attend[:, 0, 0, :width].masked_fill_(attention_mask.bool(), 0.0)
        self.column = torch.tensor([width], dtype=torch.long, device=device)
        """Where the next fed token's key and value go (the same column for every row)."""
        self.position = position_ids[:, -1:] + 1
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        """The step's input: one token per row, copied in before each step."""
        self.slots = _Slots(keys, values, self.column)

    def feed(self, tokens: torch.Tensor) -> None:
        """Set the next step's input tokens (``[rows]``)."""
        self.tokens.copy_(tokens.view(-1, 1))

    def step(self) -> torch.Tensor:
        """One decoding step over the fed tokens: the last position's logits, ``[rows, vocab]``; the
        state advances one column. In the prefill's autocast when it ran under one (``autocast_dtype``)."""
        device_type = self.column.device.type
        if self.autocast_dtype is None or (
            torch.is_autocast_enabled(device_type)
            and torch.get_autocast_dtype(device_type) == self.autocast_dtype
        ):  # no autocast, or the caller's is the prefill's (the trainers' rollouts run inside theirs)
            return self._step()
        # without the cast cache: it would live within this one step anyway (the weights are cast once a
        # step either way), and nothing cached outlives a recording
        with torch.autocast(device_type, dtype=self.autocast_dtype, cache_enabled=False):
            return self._step()

    def _step(self) -> torch.Tensor:
        self.attend.index_fill_(-1, self.column, 0.0)
        hidden = self.decoder.embed_tokens(self.tokens)
        rope = self.decoder.rotary_emb(hidden, position_ids=self.position)
        for layer in self.layers:
            out = layer(
                hidden,
                attention_mask=self.attend,
                position_ids=self.position,
                position_embeddings=rope,
                use_cache=True,
                **{self.cache_keyword: self.slots},
            )
            hidden = out[0] if isinstance(out, tuple) else out
        logits = self.lm_head(self.decoder.norm(hidden[:, -1]))
        self.column.add_(1)
        self.position.add_(1)
        return logits

    def state(self) -> tuple[int, torch.Tensor]:
        """The column and a copy of the positions, for ``restore``."""
        return int(self.column), self.position.clone()

    def restore(self, state: tuple[int, torch.Tensor]) -> None:
        """Go back (or forward) to a ``state``. A step redone from it rewrites its key, value and mask
        column, with the same values when its input is the same."""
        self.column.fill_(state[0])
        self.position.copy_(state[1])

    def written(self, steps: int) -> tuple[Any, torch.Tensor]:
        """After ``steps`` fed tokens: the buffers' columns written so far as a cache with ``.layers``, and
        their ``[rows, columns]`` attention mask (the columns ``attend`` does not hide), for
        ``PrefixCache.put``."""
        length = self.width + steps
        view = _View(
            [_Layer(k[:, :, :length], v[:, :, :length]) for k, v in zip(self.keys, self.values, strict=True)]
        )
        return view, (self.attend[:, 0, 0, :length] == 0).long()


class GraphRecorder:
    """What one backend's calls share for their graphs, per device: one side stream to record on (its
    cuBLAS workspace made by the first checked step, outside any graph's memory), one graph memory pool,
    and the last call's graph, held until the next recording has taken its share of the pool
    (``hold``); and ``refusal``: why graphs were given up.

    Why the last graph is held: torch's allocator refuses a recording into a pool whose graphs were all
    freed while its memory stays cached (``use_count > 0 INTERNAL ASSERT FAILED``). The first H200 run
    (2026-11-29) met it: each call's graph was freed when the call ended, and every call after the first
    dropped its graph. A pool of its own for each recording would leave each freed pool's memory cached
    until ``empty_cache`` (tens of MB a call, hundreds of calls a run). A held graph is never replayed
    again: the next recording may reuse its memory.

    A recording that fails can leave torch's allocator still routing to the pool and (torch <= 2.11) the
    device's random generator marked as recording, since torch raises before it ends either; so after
    one failure, or one graph that disagrees, no call records again: the calls decode eagerly over the
    static buffers and report ``graph dropped`` with the reason."""

    def __init__(self) -> None:
        self.streams: dict[torch.device, Any] = {}
        self.pools: dict[torch.device, Any] = {}
        self.held: dict[torch.device, Any] = {}
        self.refusal: str | None = None

    def stream(self, device: torch.device) -> Any:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def pool(self, device: torch.device) -> Any:
        if device not in self.pools:
            self.pools[device] = torch.cuda.graph_pool_handle()
        return self.pools[device]

    def hold(self, device: torch.device, graph: Any) -> Any:
        """Keep ``graph`` (whose recording into the pool has begun); returns the previous one, for the
        caller to let go once the recording has ended (not while it runs)."""
        previous, self.held[device] = self.held.get(device), graph
        return previous


def _stop_routing_to_pool(device: torch.device, pool: Any) -> None:
    """After a failed recording: tell torch's allocator to stop routing this thread's allocations to the
    graph's pool (what ``capture_end`` does when it succeeds). A private torch call, named differently
    across versions; best effort."""
    for name in ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool"):
        end = getattr(torch._C, name, None)
        if end is not None:
            try:
                end(device.index if device.index is not None else torch.cuda.current_device(), pool)
            except (RuntimeError, TypeError):  # already ended, or another signature
                pass
            return


class CudaGraphStep:
    """``StaticDecoder.step`` recorded as a CUDA graph (see the module docstring): ``__call__`` gives the
    next step's logits, eagerly for the first two steps and as a replay after.

    ``outcome``: ``graph`` once the graph has passed its check (later steps are replays), ``eager`` before
    (a call that ended within two steps), ``graph dropped`` when the graph failed to record or its check,
    or an earlier call's did (``GraphRecorder.refusal``); ``reason`` says why, ``check_error`` is the
    checked step's relative L2 error."""

    def __init__(self, decoder: StaticDecoder, recorder: GraphRecorder) -> None:
        self.decoder = decoder
        self.recorder = recorder
        self.graph: Any = None
        self.logits: torch.Tensor | None = None
        self.calls = 0
        self.outcome = "eager"
        self.reason: str | None = None
        self.check_error: float | None = None
        if recorder.refusal is not None:
            self.outcome, self.reason = "graph dropped", recorder.refusal

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return self.logits  # type: ignore[return-value]
        if self.calls == 1 or self.reason is not None:
            return self.decoder.step()
        with torch.cuda.device(self.decoder.column.device):
            return self._record()

    def _record(self) -> torch.Tensor:
        """The second step: eagerly, then recorded, replayed and checked against the eager one."""
        device = self.decoder.column.device
        side, pool = self.recorder.stream(device), self.recorder.pool(device)
        before = self.decoder.state()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            eager, waits = self._eager_step(before)
        torch.cuda.current_stream().wait_stream(side)
        if waits is not None:
            return self._drop(f"the step waits on the CPU, which a graph cannot hold: {_brief(waits)}", eager)
        after = self.decoder.state()
        self.decoder.restore(before)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            logits, failure = self._capture(graph, device, pool)
        torch.cuda.current_stream().wait_stream(side)
        if failure is not None:  # nothing ran: the eager step's writes stand
            self.decoder.restore(after)
            reason = f"the graph did not record: {_brief(failure)}"
            return self._drop(reason + _end_generator_recording(device, side), eager)
        if int(self.decoder.column) != before[0]:  # recording ran the step: it again, eagerly
            self.decoder.restore(before)
            eager = self.decoder.step()
            return self._drop("the step ran while it was being recorded (the graph holds nothing)", eager)
        logits.fill_(float("nan"))
        graph.replay()
        moved = int(self.decoder.column) - before[0]
        error = float((logits.float() - eager.float()).norm() / eager.float().norm().clamp_min(1e-12))
        self.check_error = error
        if moved != 1 or not error <= GRAPH_TOLERANCE:  # NaN fails too: the replay wrote no logits
            self.decoder.restore(before)  # the replay may have written the column: the eager step again
            eager = self.decoder.step()
            why = f"the replay moved the column by {moved}" if moved != 1 else f"relative error {error:.3g}"
            return self._drop(f"the graph's step differs from the eager one ({why})", eager)
        self.graph, self.logits, self.outcome = graph, logits, "graph"
        return logits

    def _eager_step(self, before: tuple[int, torch.Tensor]) -> tuple[torch.Tensor, BaseException | None]:
        """The step, with any wait on the CPU made an error (a step that waits cannot be recorded), and
        that error; a step stopped by one is redone whole from ``before``, the mode as it was."""
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return self.decoder.step(), None
        except RuntimeError as e:  # the step stopped before its end: the state has not moved
            waits = e
        finally:
            torch.cuda.set_sync_debug_mode(mode)
        self.decoder.restore(before)
        return self.decoder.step(), waits

    def _capture(
        self, graph: Any, device: torch.device, pool: Any
    ) -> tuple[torch.Tensor | None, BaseException | None]:
        """Record one step into ``graph`` (nothing runs): its output logits, or the first error. A failed
        recording is told to the allocator, which torch leaves routing to the pool when it raises. Once
        the recording has begun (and holds its share of the pool), the backend holds this graph. An
        interrupt (Ctrl-C in a notebook, whose process goes on) ends the recording and the generator's
        mark before it passes on: else every later CUDA call of the process would meet a recording."""
        try:
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        except RuntimeError as e:
            _stop_routing_to_pool(device, pool)
            return None, e
        logits, failure, previous = None, None, None
        try:
            previous = self.recorder.hold(device, graph)
            logits = self.decoder.step()
        except Exception as e:  # noqa: BLE001 - whatever stops the step, the recording must be ended
            failure = e
        except BaseException:
            if _end_capture(graph, device, pool) is not None:
                _end_generator_recording(device, torch.cuda.current_stream())
            raise
        ended = _end_capture(graph, device, pool)  # always: a failed step's recording is ended too
        failure = failure or ended
        del previous  # the last call's graph goes once this recording holds the pool
        return logits, failure

    def _drop(self, reason: str, logits: torch.Tensor) -> torch.Tensor:
        self.outcome, self.reason = "graph dropped", reason
        self.recorder.refusal = reason
        return logits


def _end_capture(graph: Any, device: torch.device, pool: Any) -> RuntimeError | None:
    """End ``graph``'s recording; if that fails, tell the allocator to stop routing to the pool and
    return the error."""
    try:
        graph.capture_end()
    except RuntimeError as e:
        _stop_routing_to_pool(device, pool)
        return e
    return None


def _end_generator_recording(device: torch.device, side: Any) -> str:
    """After a failed recording: take the device's random generator out of its recording state. torch's
    ``capture_begin`` starts the generator's recording before it can fail, and only a ``capture_end``
    that succeeds ends it; until then every random draw on the device (``torch.randn``, ``generate``'s
    sampling, weight initialisation) raises "Offset increment outside graph capture encountered
    unexpectedly" (the first H200 run: ``generate`` and TRL's trainer failed so after a dropped graph). A
    trivial recording that succeeds ends it. ragrl's own sampling draws on the CPU and is not affected.
    (torch 2.13 keeps the recording state per recording, and a failed one leaves no mark: then this
    changes nothing.) Returns "" when the generator was put back, else a note for the reason."""
    try:
        with torch.cuda.stream(side):
            scratch = torch.zeros(1, device=device)
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=torch.cuda.graph_pool_handle(), capture_error_mode="thread_local")
            scratch.add_(1)
            graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        state = torch.cuda.get_rng_state(device)
        torch.rand(1, device=device)  # raises while the generator still thinks it is recording
        torch.cuda.set_rng_state(state, device)  # the probe's draw leaves the seeded stream where it was
    except RuntimeError as e:
        return f" (and the device's random generator may still be marked as recording: {_brief(e)})"
    return ""


def _brief(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__
