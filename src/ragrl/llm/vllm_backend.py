"""Generation with vLLM (the optional ``ragrl[vllm]`` extra; this module imports without it).

Mapping of ``SamplingParams`` (ours → vLLM's, one request per prompt):

==================  ===================================================================
ours                vLLM
==================  ===================================================================
prompt token ids    ``TokensPrompt(prompt_token_ids=...)`` (nothing is re-tokenized)
max_new_tokens      ``max_tokens``
temperature         ``temperature`` (0 → greedy in vLLM too)
top_k=0 / top_p     ``top_k=-1`` (vLLM's "off"; 0 is also accepted by recent versions) / ``top_p``
stop                ``stop``, ``include_stop_str_in_output=True`` (the text keeps the stop string;
                    the token ids are never cut: vLLM returns every sampled token)
stop_token_ids      ``stop_token_ids`` (the model's EOS ids stop anyway: ``ignore_eos=False``)
seed / seeds        ``seeds[i]`` or ``seed + i`` for prompt ``i`` (per-request generators: a
                    sequence's result does not depend on the rest of the batch, like
                    ``TransformersBackend``)
log-probs           ``logprobs=0`` (only the sampled token's), read from ``logprobs[j][token]``
(no penalties)      ``repetition/presence/frequency_penalty`` at their neutral values, ``min_p=0``
==================  ===================================================================

Log-prob convention. vLLM V1 (≥ 0.10) reports, by default (``logprobs_mode="raw_logprobs"``),
``log_softmax(logits)`` of the *raw* logits: before temperature. Our convention is
``log_softmax(logits / T)`` over the full vocabulary, which is vLLM's ``"processed_logprobs"``
(temperature applied) whenever no top-k / top-p truncation is requested. So the engine is built with
``logprobs_mode="processed_logprobs"`` (when the installed vLLM has the option); greedy requests get
``log_softmax(logits)`` in that mode too. With ``top_k > 0`` or ``top_p < 1`` vLLM's processed
log-probs are those of the *truncated, renormalised* distribution (what was actually sampled from),
not the full-vocabulary ones; every ``Generation`` says which it got in
``metadata["logprobs_mode"]``/``metadata["truncated"]``.

Weights. A trainer hands the engine its new weights with ``VLLMBackend.load_weights`` (HF names, as
``state_dict()`` gives them): each tensor travels as raw bytes with its dtype and shape (``pack_weights``;
vLLM's message codec turns tensors inside a utility call's arguments into lists) to the worker
extension ``WeightSync``, which rebuilds it and calls the model runner's ``reload_weights`` (vLLM's own
in-place reload, which re-lays the weights as each backend needs; ``model.load_weights`` alone does not
on the CPU backend). The round trip goes through the engine's message queue, so it costs a copy of the
weights: fine for the models of a CPU or a single GPU, not the way to move 7B weights every step (vLLM's
NCCL weight transfer is, docs/backends.md).

Finish reasons: vLLM's ``"length"`` → ``"length"``; ``"stop"`` with ``stop_reason`` a string →
``"stop"`` (that string); ``stop_reason`` an int → ``"stop"`` (that id) unless it is an EOS id (the
tokenizer's or the model's ``generation_config.json`` ones, which vLLM adds to the stop ids) → ``"eos"``;
``stop_reason`` None (EOS) → ``"eos"`` with the last token id.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from ragrl.errors import RagrlError
from ragrl.llm.backend import FinishReason, Generation, SamplingParams, model_eos_ids

__all__ = [
    "VLLMBackend",
    "WeightSync",
    "pack_weights",
    "to_generation",
    "unpack_weights",
    "vllm_sampling_kwargs",
]

_INSTALL_HINT = "vLLM is not installed: pip install 'ragrl[vllm]'"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RagrlError(_INSTALL_HINT) from err
    return vllm


def vllm_sampling_kwargs(params: SamplingParams, seed: int | None) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword arguments for one request (pure; testable without vLLM)."""
    return {
        "n": 1,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "include_stop_str_in_output": True,
        "ignore_eos": False,
        "seed": seed,
        "logprobs": 0,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "detokenize": True,  # stop strings need the text
    }


def _logprob_value(entry: Any) -> float:
    return float(entry.logprob if hasattr(entry, "logprob") else entry)


def to_generation(
    output: Any, params: SamplingParams, eos_token_ids: Sequence[int] = (), logprobs_mode: str = "unknown"
) -> Generation:
    """Map one vLLM ``CompletionOutput`` (``token_ids``, ``logprobs``, ``finish_reason``,
    ``stop_reason``) to a ``Generation``."""
    token_ids = [int(t) for t in output.token_ids]
    if output.logprobs is None:
        raise RagrlError("vLLM returned no log-probs (the request must set logprobs=0)")
    logprobs = [_logprob_value(step[tok]) for step, tok in zip(output.logprobs, token_ids, strict=True)]
    reason: FinishReason
    stop: str | int | None
    vllm_reason = output.finish_reason
    stop_reason = getattr(output, "stop_reason", None)
    if vllm_reason == "length":
        reason, stop = "length", None
    elif isinstance(stop_reason, str):
        reason, stop = "stop", stop_reason
    elif isinstance(stop_reason, int) and stop_reason not in set(eos_token_ids):
        reason, stop = "stop", stop_reason
    elif vllm_reason == "stop":
        reason, stop = "eos", (token_ids[-1] if token_ids else None)
    else:  # "abort" or an unknown reason: the sequence did not finish on its own
        reason, stop = "length", None
    truncated = params.temperature > 0 and (params.top_k > 0 or params.top_p < 1.0)
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        stop=stop,
        metadata={
            "backend": "vllm",
            "vllm_finish_reason": vllm_reason,
            "logprobs_mode": logprobs_mode,
            "truncated": truncated,
        },
    )


def pack_weights(
    named: Iterable[tuple[str, Any]], dtype: Any = None
) -> tuple[list[str], list[tuple[bytes, str, list[int]]]]:
    """``(name, tensor)`` pairs as (names, [(raw bytes, torch dtype name, shape)]): what crosses the
    engine's message queue intact (pure; ``unpack_weights`` is its inverse). ``dtype``: floating tensors
    cast to it first (the engine's; half the bytes for a bf16 engine of an fp32 policy)."""
    import torch

    names, blobs = [], []
    for name, tensor in named:
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        names.append(name)
        blobs.append((raw, str(t.dtype).removeprefix("torch."), list(t.shape)))
    return names, blobs


def unpack_weights(names: Sequence[str], blobs: Sequence[Sequence[Any]]) -> list[tuple[str, Any]]:
    """The ``(name, tensor)`` pairs ``pack_weights`` packed, bit for bit."""
    import torch

    out = []
    for name, (raw, dtype, shape) in zip(names, blobs, strict=True):
        kind = getattr(torch, str(dtype), None)
        if not isinstance(kind, torch.dtype):
            raise RagrlError(f"weight {name!r}: unknown dtype {dtype!r}")
        buffer = bytearray(raw)  # writable, owned by the tensor built on it
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out.append((name, flat.view(kind).reshape([int(x) for x in shape])))
    return out


class WeightSync:
    """The worker extension a ``VLLMBackend`` engine is built with (``worker_extension_cls``): its methods
    become the engine workers' own, called by name through ``collective_rpc``."""

    def ragrl_load_weights(self, names: list[str], blobs: list[Any]) -> int:
        weights = unpack_weights(names, blobs)
        self.model_runner.reload_weights(weights_iterator=iter(weights))  # type: ignore[attr-defined]
        return len(weights)


class VLLMBackend:
    """A ``GenerationBackend`` over ``vllm.LLM`` (token-id prompts, one request per prompt).

    ``engine_kwargs`` go to ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``,
    ``dtype``, ``max_model_len``, ...). ``logprobs_mode`` defaults to ``"processed_logprobs"`` where
    the installed vLLM supports it (see the module docstring).
    """

    def __init__(self, model_path: str, **engine_kwargs: Any) -> None:
        vllm = _import_vllm()
        self._vllm = vllm
        kwargs = dict(engine_kwargs)
        if "logprobs_mode" not in kwargs and _engine_accepts(vllm, "logprobs_mode"):
            kwargs["logprobs_mode"] = "processed_logprobs"
        if "enable_chunked_prefill" not in kwargs and _on_cpu():
            # vLLM's CPU build re-winds a seeded request's generator when a chunked prefill discards its
            # sampled token, and torch's CPU generators cannot (`CPU Generator does not use offset`):
            # whole prompts only there (measured: 128 requests of a multi-turn rollout stopped it)
            kwargs["enable_chunked_prefill"] = False
        if "worker_extension_cls" not in kwargs and _engine_accepts(vllm, "worker_extension_cls"):
            kwargs["worker_extension_cls"] = f"{__name__}.WeightSync"
        self.can_load_weights = kwargs.get("worker_extension_cls") == f"{__name__}.WeightSync"
        self.logprobs_mode = str(kwargs.get("logprobs_mode", "raw (vLLM without logprobs_mode)"))
        self.llm = vllm.LLM(model=str(model_path), **kwargs)
        try:  # the engine's processes run now: stop them if the rest fails
            self.dtype = getattr(getattr(self.llm.llm_engine, "model_config", None), "dtype", None)
            """The engine's weight dtype (new weights are cast to it before they travel)."""
            self.tokenizer = self.llm.get_tokenizer()
            self.eos_token_ids = model_eos_ids(str(model_path), self.tokenizer)
        except BaseException:
            self.close()
            raise

    def load_weights(self, named: Iterable[tuple[str, Any]]) -> int:
        """Put ``named`` (HF parameter names → tensors, e.g. a policy's ``state_dict().items()``) into the
        engine's model, in place; returns how many tensors each worker loaded."""
        if not self.can_load_weights:
            raise RagrlError(
                "this vLLM engine was built without ragrl's worker extension (worker_extension_cls): it "
                "cannot take new weights"
            )
        # every name, a tied head too: vLLM's in-place reload loaded nothing right when the head was left
        # out (measured on the CPU build with the tied reader base)
        names, blobs = pack_weights(named, self.dtype)
        loaded = self.llm.collective_rpc("ragrl_load_weights", args=(names, blobs))
        self.clear_prefix_cache()  # its keys and values came from the old weights
        return int(min(loaded))

    def clear_prefix_cache(self) -> None:
        """Drop the engine's cached prompt prefixes (vLLM's automatic prefix caching)."""
        if self.llm.reset_prefix_cache() is False:  # it declines while requests hold cached blocks
            raise RagrlError("vLLM did not drop its prefix cache (requests still running)")

    def close(self) -> None:
        """Stop the engine's processes (a process that holds a running engine cannot exit)."""
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()

    def sleep(self) -> None:
        """Free the engine's GPU memory for the update (vLLM's sleep mode, level 1: the weights go to
        CPU memory and the KV cache is dropped); needs ``enable_sleep_mode=True`` and a GPU."""
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        self.llm.wake_up()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, in order."""
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        requests = []
        sampling = []
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise RagrlError(f"prompt {i} is empty")
            requests.append(TokensPrompt(prompt_token_ids=[int(t) for t in p]))
            seed = params.prompt_seed(i)
            sampling.append(self._vllm.SamplingParams(**vllm_sampling_kwargs(params, seed)))
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        eos = tuple(self.eos_token_ids)
        return [to_generation(o.outputs[0], params, eos, self.logprobs_mode) for o in outputs]


def _on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _engine_accepts(vllm: Any, name: str) -> bool:
    """Whether ``vllm.LLM`` / ``EngineArgs`` know the engine option ``name``."""
    engine_args = getattr(vllm, "EngineArgs", None)
    if engine_args is not None and dataclasses.is_dataclass(engine_args):
        return name in {f.name for f in dataclasses.fields(engine_args)}
    try:
        return name in inspect.signature(vllm.LLM.__init__).parameters
    except (TypeError, ValueError):
        return False
