"""Generation with a plain transformers model: our own sampling loop over a KV cache.

Why not ``model.generate``: it merges the model's ``generation_config`` (often ``top_k=50``,
``top_p``, ``repetition_penalty``...) into every call unless each field is overridden, and its
``output_scores`` are the *processed* scores. Our loop applies exactly what ``SamplingParams`` says
and nothing else, so the reported log-probs are ``log_softmax(logits / T)`` over the full
vocabulary (before top-k / top-p), and with ``top_k=0, top_p=1.0`` the tokens are drawn from exactly
that distribution (see ``ragrl.llm.backend`` for the convention, ``docs/backends.md`` for the facts).

Batches are LEFT-padded; position ids come from the attention mask (``cumsum - 1``), so a sequence
gets the same logits as alone or right-padded in training (``ragrl.llm.logprobs.token_logprobs``).

Seeds: sequence ``i`` of a call (its index in ``prompts``) samples with its own CPU
``torch.Generator`` seeded with ``params.seeds[i]`` when given, else ``params.seed + i``; one uniform
draw per step picks the token by inverse CDF. A sequence's result therefore does not depend on the
batch size, on the other prompts in the call or on the device the model runs on (beyond
floating-point differences in the logits).
``seed=None`` draws the per-call seed from torch's global RNG (so ``torch.manual_seed`` fixes it).

KV caches (growing storage, the prefix cache across rollout turns): see ``ragrl.llm.kv_cache``; decoding
over static buffers replayed as a CUDA graph (``decode``): see ``ragrl.llm.static_decode``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ragrl.errors import RagrlError
from ragrl.llm.backend import FinishReason, Generation, SamplingParams
from ragrl.llm.checksums import verify_checksums
from ragrl.llm.devices import resolve_device
from ragrl.llm.kv_cache import PrefixCache, new_cache
from ragrl.llm.logprobs import accepts_logits_to_keep, cache_keyword, pad_batch, position_ids_from_mask
from ragrl.llm.sampling import pick
from ragrl.llm.static_decode import CudaGraphStep, GraphRecorder, StaticDecoder, unsupported_reason
from ragrl.llm.stops import StopMatcher

__all__ = ["DECODE_MODES", "TransformersBackend", "resolve_device", "resolve_dtype"]

DECODE_MODES = ("auto", "loop", "static", "graph")
"""How a call decodes after its prefill (``ragrl.llm.static_decode``): ``loop``, the model's forward with
a growing cache, finished rows dropped; ``static``, the model's decoder layers over static key/value
buffers; ``graph``, the static step replayed as a CUDA graph; ``auto``: graph on CUDA for a supported
model, else loop."""

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"``: bfloat16 on a GPU that supports it (else float16), float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise RagrlError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(sorted(_DTYPES))}") from None


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer in a local model folder; a folder without a readable one is a ``RagrlError``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, EOFError, RuntimeError) as e:
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        raise RagrlError(
            f"{path}: no tokenizer transformers can load ({type(e).__name__}: {reason})"
        ) from None


ADAPTER_CONFIG = "adapter_config.json"


def adapter_base(path: Path) -> Path:
    """The base model folder of the LoRA adapters saved in ``path`` (its ``adapter_config.json``'s
    ``base_model_name_or_path``, a local folder)."""
    config = path / ADAPTER_CONFIG
    try:
        base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise RagrlError(f"{config}: not a LoRA adapter config ({e})") from None
    if not base or not Path(base).is_dir():
        raise RagrlError(
            f"{config}: base_model_name_or_path {base!r} is not a local model folder (the adapters need "
            "the model they were trained on)"
        )
    return Path(base).resolve()


def _load(path: Path, dtype: torch.dtype, *, keep_adapter: bool = False) -> Any:
    """The causal LM in a local folder; a folder transformers cannot load (empty, no weights, a broken
    config or weights file), or whose ``SHA256SUMS`` does not match, is a ``RagrlError`` naming it. A
    folder of LoRA adapters (a LoRA run's ``policy/`` or ``best/``) loads its base model with the adapters
    merged in, or, with ``keep_adapter``, as a peft model whose adapters train on."""
    if (path / ADAPTER_CONFIG).is_file():
        return _load_adapter(path, dtype, keep_adapter)
    from transformers import AutoModelForCausalLM

    verify_checksums(path)  # a folder that ships SHA256SUMS (the reader base) is checked first

    try:
        try:
            return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError, EOFError, RuntimeError) as e:
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        raise RagrlError(
            f"{path}: not a model folder transformers can load ({type(e).__name__}: {reason})"
        ) from None


def _load_adapter(path: Path, dtype: torch.dtype, trainable: bool) -> Any:
    try:
        from peft import PeftModel
    except ImportError:
        raise RagrlError(f"{path} holds LoRA adapters, which need peft: pip install 'ragrl[lora]'") from None
    from safetensors import SafetensorError

    base_path = adapter_base(path)
    try:
        model = PeftModel.from_pretrained(_load(base_path, dtype), str(path), is_trainable=trainable)
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as e:
        raise RagrlError(f"{path}: cannot load its LoRA adapters onto {base_path} ({e})") from None
    return model if trainable else model.merge_and_unload()


class TransformersBackend:
    """A ``GenerationBackend`` over a Hugging Face causal LM (CPU or CUDA).

    ``model_or_path``: a local model directory (loaded with ``AutoModelForCausalLM`` /
    ``AutoTokenizer``; nothing is downloaded) or a model object (then ``tokenizer`` is required).
    ``device="auto"`` picks CUDA when available (a given model object stays where it is);
    ``dtype="auto"`` is bf16 on GPU and fp32 on CPU. ``batch_size`` prompts are decoded together
    (longest first, to waste little padding); ``max_prompt_len`` rejects longer prompts.

    EOS: the tokenizer's ``eos_token_id`` and the model's ``generation_config.eos_token_id`` (one id or
    a list, as vLLM also stops on) end a sequence with ``finish_reason="eos"``. ``stop_token_ids``
    end it with ``"stop"`` and ``stop`` = the token id; stop strings with ``"stop"`` and the string.

    ``decode`` (``DECODE_MODES``): how each call decodes after its prefill; ``auto`` replays the decoding
    step as a CUDA graph on a GPU for Llama / Qwen2 / Qwen3 / Mistral models and runs the plain loop
    elsewhere. Each generation's ``metadata["decode"]`` says what ran.
    """

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        batch_size: int = 16,
        max_prompt_len: int | None = None,
        prefix_cache_mb: float = 256.0,
        decode: str = "auto",
    ) -> None:
        if batch_size < 1:
            raise RagrlError(f"batch_size must be >= 1, got {batch_size}")
        if decode not in DECODE_MODES:
            raise RagrlError(f"decode={decode!r}: use one of {', '.join(DECODE_MODES)}")
        if isinstance(model_or_path, str | Path):
            path = Path(model_or_path)
            if not path.is_dir():
                raise RagrlError(
                    f"{path}: not a local model directory (ragrl loads models from disk only; "
                    "download the model first, e.g. with `huggingface-cli download`)"
                )
            self.device = resolve_device(device)
            self.dtype = resolve_dtype(dtype, self.device)
            model = _load(path, self.dtype).to(self.device)  # the weights first: the clearer error
            if tokenizer is None:
                tokenizer = load_tokenizer(path)
        else:
            model = model_or_path
            if tokenizer is None:
                raise RagrlError("TransformersBackend: pass the tokenizer along with a model object")
            current = next(model.parameters()).device
            self.device = current if device == "auto" else resolve_device(device)
            if dtype == "auto":
                self.dtype = next(model.parameters()).dtype
            else:
                self.dtype = resolve_dtype(dtype, self.device)
            model = model.to(device=self.device, dtype=self.dtype)
        if isinstance(model_or_path, str | Path):
            model.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_prompt_len = max_prompt_len
        self.prune_finished = True
        """Drop finished rows from the KV cache (when the cache supports it); False keeps them."""
        self.prefix_cache = PrefixCache(prefix_cache_mb)
        self.decode = decode
        self._mode: str | None = None
        self.graphs = GraphRecorder()
        """The graphs' side streams and memory pools, and why graphs were given up (``refusal``)."""
        self.decode_log: Counter[str] = Counter()
        """Batches decoded, by what ran after the prefill (``loop``, ``static``, ``graph``, ``graph dropped``,
        ``eager``: a graph call that ended within two steps, ``prefill only``)."""
        self.eos_token_ids = self._eos_ids()
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_token_id = int(pad)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_cfg = getattr(self.model, "generation_config", None)
        extra = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, list | tuple):
            ids.update(int(x) for x in extra)
        return frozenset(ids)

    def _decode_mode(self) -> str:
        """``loop``, ``static`` or ``graph`` (``decode="auto"``: graph on CUDA for a supported model, else
        the plain loop), decided at the first call; an explicit mode the model or device cannot run is a
        ``RagrlError``."""
        if self._mode is None:
            self._mode = self._resolve_mode()
        return self._mode

    def _resolve_mode(self) -> str:
        if self.decode == "loop":
            return "loop"
        reason = unsupported_reason(self.model)
        if self.decode == "auto":
            return "graph" if reason is None and self.device.type == "cuda" else "loop"
        if reason is not None:
            raise RagrlError(f"decode={self.decode!r}: {reason}; use decode='loop' (or 'auto')")
        if self.decode == "graph" and self.device.type != "cuda":
            raise RagrlError(
                f"decode='graph' needs a CUDA device, the model is on {self.device}; use 'static'"
            )
        return self.decode

    # ------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, in order (see the module docstring for seeds)."""
        prompts = [list(map(int, p)) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise RagrlError(f"prompt {i} is empty")
            if self.max_prompt_len is not None and len(p) > self.max_prompt_len:
                raise RagrlError(
                    f"prompt {i} has {len(p)} tokens, more than max_prompt_len={self.max_prompt_len}"
                )
        if not prompts:
            return []
        if params.seeds is not None and len(params.seeds) != len(prompts):
            raise RagrlError(f"{len(params.seeds)} seeds for {len(prompts)} prompts")
        base_seed = None
        if params.seed is None and params.seeds is None:
            base_seed = int(torch.randint(0, 2**62, (1,)).item())
        seeds = [params.prompt_seed(i, base_seed) for i in range(len(prompts))]
        mode = self._decode_mode()  # before the prefix cache gives anything away
        self.prefix_cache.check_weights(self.model)
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()  # a policy shared with the trainer goes back to its mode afterwards
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                gens = self._generate_batch([prompts[i] for i in idx], [seeds[i] for i in idx], params, mode)
                for i, g in zip(idx, gens, strict=True):
                    results[i] = g
        finally:
            self.model.train(was_training)
        return [g for g in results if g is not None]

    def clear_prefix_cache(self) -> None:
        self.prefix_cache.clear()

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], seeds: list[int], params: SamplingParams, mode: str
    ) -> list[Generation]:
        t0 = time.perf_counter()
        n = len(prompts)
        dev = self.device
        greedy = params.temperature == 0
        generators = []
        for s in seeds:
            g = torch.Generator(device="cpu")
            g.manual_seed(s % (2**63))
            generators.append(g)
        matcher = StopMatcher(self.tokenizer, params.stop)
        stop_ids = frozenset(int(t) for t in params.stop_token_ids)

        hits = [self.prefix_cache.take(p) for p in prompts]
        if any(h is not None for h in hits):
            input_ids, attention_mask, position_ids, cache = self._resume(prompts, hits)
            del hits  # the kept tensors live on in the new cache only
        else:
            input_ids, attention_mask = pad_batch(prompts, self.pad_token_id, "left", device=dev)
            position_ids = position_ids_from_mask(attention_mask)
            cache = new_cache(self.model)
        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lps: list[list[float]] = [[] for _ in range(n)]
        finish: list[tuple[FinishReason, str | int | None] | None] = [None] * n
        active = list(range(n))  # rows of the current (possibly pruned) batch -> sequence index
        can_prune = self.prune_finished
        extra: dict[str, Any] = {"logits_to_keep": 1} if accepts_logits_to_keep(self.model) else {}
        cache_key = cache_keyword(self.model)
        static: StaticDecoder | None = None  # after the prefill, in the static and graph modes
        run_step: Callable[[], torch.Tensor] | None = None

        for step in range(params.max_new_tokens):
            if static is None:  # the prefill, and every step of the plain loop
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=True,
                    **{cache_key: cache},
                    **extra,
                )
                cache = out[cache_key]
                logits = out.logits[:, -1, :].float()
            else:
                logits = run_step().float()  # type: ignore[misc]
            tokens, lps = pick(logits, params, [generators[i] for i in active], greedy)
            tok_list = tokens.tolist()
            lp_list = lps.tolist()

            keep: list[int] = []
            for row, seq in enumerate(active):
                if finish[seq] is not None:  # finished earlier, kept only because the cache was not pruned
                    continue
                tok = tok_list[row]
                out_ids[seq].append(tok)
                out_lps[seq].append(lp_list[row])
                if tok in self.eos_token_ids:
                    finish[seq] = ("eos", tok)
                elif tok in stop_ids:
                    finish[seq] = ("stop", tok)
                else:
                    hit = matcher(out_ids[seq])
                    if hit is not None:
                        finish[seq] = ("stop", hit)
                    elif step + 1 == params.max_new_tokens:
                        finish[seq] = ("length", None)
                if finish[seq] is None:
                    keep.append(row)
                elif self.prefix_cache.enabled:
                    # the cache holds every token fed so far: the prompt and the generation but its last
                    fed, mask = (cache, attention_mask) if static is None else static.written(step)
                    self.prefix_cache.put(prompts[seq] + out_ids[seq][:-1], fed, row, mask[row])
            if not keep:
                break

            next_tokens = tokens.to(dev)
            if mode != "loop":  # every row is fed, finished or not: the static step's shapes are fixed
                if static is None:
                    static = StaticDecoder(
                        self.model, cache, attention_mask, position_ids, params.max_new_tokens - 1
                    )
                    cache = out = None  # the prefill's cache lives on in the static buffers only
                    run_step = CudaGraphStep(static, self.graphs) if mode == "graph" else static.step
                static.feed(next_tokens)
                continue
            if len(keep) < len(active) and can_prune and hasattr(cache, "batch_select_indices"):
                sel = torch.tensor(keep, device=dev)
                try:
                    cache.batch_select_indices(sel)
                except (NotImplementedError, AttributeError, TypeError):
                    can_prune = False
                else:
                    attention_mask = attention_mask.index_select(0, sel)
                    position_ids = position_ids.index_select(0, sel)
                    next_tokens = next_tokens.index_select(0, sel)
                    active = [active[r] for r in keep]
            input_ids = next_tokens[:, None]
            attention_mask = torch.cat(
                [attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], 1
            )
            position_ids = position_ids[:, -1:] + 1

        elapsed = time.perf_counter() - t0
        # what decoded the batch after its prefill: loop, static, graph, "graph dropped" (the reason in the
        # metadata), eager (graph mode, ended within two steps), or nothing ("prefill only")
        about: dict[str, Any] = {}
        if static is None:
            decoded = "loop" if mode == "loop" else "prefill only"
        elif isinstance(run_step, CudaGraphStep):
            decoded = run_step.outcome
            about = {"decode_reason": run_step.reason, "graph_check_error": run_step.check_error}
        else:
            decoded = "static"
        self.decode_log[decoded] += 1
        gens = []
        for seq in range(n):
            reason, stop = finish[seq] if finish[seq] is not None else ("length", None)
            gens.append(
                Generation(
                    token_ids=out_ids[seq],
                    logprobs=out_lps[seq],
                    finish_reason=reason,
                    stop=stop,
                    metadata={
                        "backend": "transformers",
                        "batch_seconds": elapsed,
                        "decode": decoded,
                        **about,
                    },
                )
            )
        return gens

    def _resume(
        self, prompts: list[list[int]], hits: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """First-step inputs when some rows continue a kept prefix: per row ``[pad][cached][pad][new]``."""
        dev = self.device
        cached = [h[0] if h is not None else 0 for h in hits]
        suffixes = [p[c:] for p, c in zip(prompts, cached, strict=True)]
        width_c, width_s = max(cached), max(len(x) for x in suffixes)
        layers = next(h[1] for h in hits if h is not None)
        layer_kv = []
        for li, (k0, v0) in enumerate(layers):
            heads, dim = k0.shape[0], k0.shape[-1]
            k = k0.new_zeros((len(prompts), heads, width_c, dim))
            v = v0.new_zeros((len(prompts), v0.shape[0], width_c, v0.shape[-1]))
            for row, h in enumerate(hits):
                if h is not None:
                    c = h[0]
                    k[row, :, width_c - c :] = h[1][li][0]
                    v[row, :, width_c - c :] = h[1][li][1]
            layer_kv.append((k, v))
        cache = new_cache(self.model)
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(ddp_cache_data=layer_kv)
        else:
            for li, (k, v) in enumerate(layer_kv):
                cache.update(k, v, li)
        mask = torch.zeros((len(prompts), width_c + width_s), dtype=torch.long, device=dev)
        input_ids = torch.full((len(prompts), width_s), self.pad_token_id, dtype=torch.long, device=dev)
        for row, (c, suffix) in enumerate(zip(cached, suffixes, strict=True)):
            mask[row, width_c - c : width_c] = 1
            mask[row, width_c + width_s - len(suffix) :] = 1
            input_ids[row, width_s - len(suffix) :] = torch.tensor(suffix, dtype=torch.long, device=dev)
        position_ids = position_ids_from_mask(mask)[:, width_c:]
        return input_ids, mask, position_ids, cache
