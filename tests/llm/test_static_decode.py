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
from ragrl.llm.static_decode import CudaGraphStep, GraphRecorder, StaticDecoder, unsupported_reason

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


class FakeCuda:
    """The CUDA calls around a graph's recording, on a CPU: streams, devices and pools are stand-ins, and
    the graph does what a test says its recording and replay do (a real CUDA graph cannot run here).
    ``events`` lists the calls that matter: recordings begun, the allocator told to stop routing to the
    pool, and the sync-debug mode set. The device's random generator is modelled as torch has it:
    ``capture_begin`` marks it as recording before anything can fail, only a ``capture_end`` that
    succeeds unmarks it, and a random draw while it is marked raises. As torch's allocator, it refuses
    a recording into a pool it knows whose graphs are all gone. Pool handles are numbered; the
    test's hooks apply to the recordings into the first pool handed out (the backend's, the decoding
    step's), not to ragrl's trivial recording that puts the generator back, which ``reset_fails``
    makes fail too. ``pools`` lists the pool of each recording begun."""

    recording = False
    generator_recording = False

    def __init__(  # noqa: PLR0913
        self,
        monkeypatch: pytest.MonkeyPatch,
        capture_begin,
        replay,
        capture_end=None,
        reset_fails=False,  # noqa: ANN001
    ) -> None:
        import contextlib

        events = self.events = []
        debug = {"mode": 0}
        import weakref

        FakeCuda.recording = FakeCuda.generator_recording = False
        pools = self.pools = []
        handles = []
        live: dict[object, weakref.WeakSet] = {}  # the graphs alive in each pool, as torch counts them

        def pool_handle() -> tuple[int, int]:
            handles.append((0, len(handles) + 1))
            return handles[-1]

        class Stream:
            def __init__(self, *args: object) -> None:
                pass

            def wait_stream(self, other: object) -> None:
                pass

        class Graph:
            def capture_begin(self, pool: object, **kwargs: object) -> None:
                events.append("capture_begin")
                pools.append(pool)
                FakeCuda.generator_recording = True
                if pool in live and not live[pool]:  # torch's allocator: a known pool with no graph left
                    raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED")
                live.setdefault(pool, weakref.WeakSet()).add(self)
                self.decoding = pool == handles[0]
                if self.decoding:
                    capture_begin()
                elif reset_fails:
                    raise RuntimeError("CUDA error: the reset's recording failed too")

            def capture_end(self) -> None:
                FakeCuda.recording = False
                if self.decoding and capture_end is not None:
                    capture_end()
                FakeCuda.generator_recording = False

            def replay(self) -> None:
                replay()

        real_rand = torch.rand

        def rand(*args: object, **kwargs: object) -> torch.Tensor:
            if FakeCuda.generator_recording:
                raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")
            return real_rand(*args, **kwargs)

        monkeypatch.setattr(torch, "rand", rand)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: torch.tensor([7]))
        monkeypatch.setattr(
            torch.cuda, "set_rng_state", lambda state, device: events.append("rng state back")
        )

        def set_mode(mode: object) -> None:
            debug["mode"] = mode
            events.append(f"sync debug {mode}")

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", pool_handle)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: debug["mode"])
        monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
        monkeypatch.setattr(
            torch._C, "_cuda_endAllocateToPool", lambda dev, pool: events.append("end pool"), raising=False
        )
        self.debug = debug


def decode_both_ways(model, step_of) -> tuple[torch.Tensor, torch.Tensor, CudaGraphStep]:  # noqa: ANN001
    """Six steps over the same prefill and fed tokens: eagerly, and through ``step_of(decoder)``."""
    feeds = torch.randint(3, 60, (6, len(PROMPTS)), generator=torch.Generator().manual_seed(0))
    runs = []
    with torch.no_grad():
        for graphed in (False, True):
            decoder, ids, _ = prefill(model, PROMPTS, steps=len(feeds))
            step = step_of(decoder) if graphed else decoder.step
            logits = []
            for fed in feeds:
                decoder.feed(fed)
                logits.append(step().clone())
            assert int(decoder.column) == ids.shape[1] + len(feeds)
            runs.append(torch.stack(logits))
    return runs[0], runs[1], step


@pytest.mark.parametrize("where", ["capture_begin", "the step"])
def test_a_graph_that_does_not_record_goes_on_eagerly(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """On a GPU, a step that cannot be recorded (an operation not allowed while capturing): the call goes
    on eagerly from the right state and says why (the step's own error, not the one ``capture_end``
    raises after it), the allocator is told to stop routing to the graph's pool (torch raises before it
    does so itself), and the backend's later calls do not record again."""
    model = llama()

    def refuse() -> None:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def end() -> None:
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    if where == "capture_begin":
        fake = FakeCuda(monkeypatch, capture_begin=refuse, replay=lambda: None)
        step_of = lambda decoder: CudaGraphStep(decoder, recorder)  # noqa: E731
    else:
        begin = lambda: setattr(FakeCuda, "recording", True)  # noqa: E731
        fake = FakeCuda(monkeypatch, capture_begin=begin, replay=lambda: None, capture_end=end)

        def step_of(decoder: StaticDecoder) -> CudaGraphStep:
            real = decoder.step

            def step() -> torch.Tensor:  # a sync inside the forward: fine eagerly, fatal while recording
                out = real()
                if FakeCuda.recording:
                    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
                return out

            decoder.step = step  # type: ignore[method-assign]
            return CudaGraphStep(decoder, recorder)

    recorder = GraphRecorder()
    eager, graphed, step = decode_both_ways(model, step_of)
    assert torch.allclose(eager, graphed, atol=1e-6)
    assert step.outcome == "graph dropped"
    assert (
        step.reason
        == "the graph did not record: CUDA error: operation not permitted when stream is capturing"
    )
    # the step's recording, then the trivial one that takes the random generator out of recording, into
    # a pool of its own; the probe's draw leaves the seeded random state as it was
    assert fake.events.count("capture_begin") == 2 and fake.events.count("end pool") == 1
    assert not FakeCuda.generator_recording and fake.events[-1] == "rng state back"
    assert fake.pools[0] == recorder.pool(torch.device("cpu")) != fake.pools[1]
    assert recorder.refusal == step.reason
    _, _, again = decode_both_ways(model, lambda decoder: CudaGraphStep(decoder, recorder))
    assert again.outcome == "graph dropped" and fake.events.count("capture_begin") == 2  # not tried again


def test_every_call_records_into_the_backends_pool_holding_the_last_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls that record and replay faithfully: each records into the backend's one pool, and the
    backend holds the last call's graph until the next recording has begun (torch's allocator refuses a
    recording into a pool whose graphs were all freed while its memory stays cached: the first H200 run
    dropped every graph after the first call's so), then lets it go."""
    import gc
    import weakref

    decoders: list[StaticDecoder] = []
    outputs: list[torch.Tensor] = []

    def step_of(decoder: StaticDecoder) -> CudaGraphStep:
        decoders.append(decoder)
        real = decoder.step

        def step() -> torch.Tensor:  # while recording nothing runs: the tensor each replay writes
            if FakeCuda.recording:
                outputs.append(torch.zeros(len(PROMPTS), len(VOCAB)))
                return outputs[-1]
            return real()

        decoder.step = step  # type: ignore[method-assign]
        return CudaGraphStep(decoder, recorder)

    def replay() -> None:  # a faithful replay: the step, its logits into the recorded tensor
        outputs[-1].copy_(decoders[-1].step())

    fake = FakeCuda(monkeypatch, capture_begin=lambda: setattr(FakeCuda, "recording", True), replay=replay)
    recorder, cpu = GraphRecorder(), torch.device("cpu")
    eager, graphed, step = decode_both_ways(llama(), step_of)
    assert step.outcome == "graph" and torch.allclose(eager, graphed, atol=1e-5)
    first = weakref.ref(recorder.held[cpu])
    del step
    gc.collect()
    assert first() is not None  # the call is over; its graph is held
    eager, graphed, step = decode_both_ways(llama(), step_of)
    assert step.outcome == "graph" and torch.allclose(eager, graphed, atol=1e-5)
    gc.collect()
    assert first() is None and recorder.held[cpu] is step.graph  # let go once the next one began
    assert fake.pools == [recorder.pool(cpu)] * 2 and "rng state back" not in fake.events


def test_a_generator_left_recording_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the trivial recording that puts the random generator back fails too, the call still goes on
    eagerly (ragrl samples on the CPU), and the reason says the device's generator may be unusable."""

    def refuse() -> None:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    FakeCuda(monkeypatch, capture_begin=refuse, replay=lambda: None, reset_fails=True)
    eager, graphed, step = decode_both_ways(llama(), lambda d: CudaGraphStep(d, GraphRecorder()))
    assert torch.allclose(eager, graphed, atol=1e-6)
    assert step.reason == (
        "the graph did not record: CUDA error: operation not permitted when stream is capturing (and the "
        "device's random generator may still be marked as recording: CUDA error: the reset's recording "
        "failed too)"
    )


def test_a_step_that_waits_on_the_cpu_is_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checked eager step runs with CUDA's sync-debug mode set to error: a step that waits on the CPU
    (an ``.item()`` in a layer, a dynamic rope update) is never recorded, its state is redone whole, and
    the mode goes back to what it was."""
    fake = FakeCuda(monkeypatch, capture_begin=lambda: None, replay=lambda: None)

    def step_of(decoder: StaticDecoder) -> CudaGraphStep:
        real = decoder.step

        def step() -> torch.Tensor:
            if fake.debug["mode"] == "error":  # the wait comes halfway: some layers wrote their column
                decoder.keys[0].index_fill_(2, decoder.column, 7.0)
                raise RuntimeError("called a synchronizing CUDA operation")
            return real()

        decoder.step = step  # type: ignore[method-assign]
        return CudaGraphStep(decoder, GraphRecorder())

    eager, graphed, step = decode_both_ways(llama(), step_of)
    assert torch.allclose(eager, graphed, atol=1e-6)
    assert (
        step.reason
        == "the step waits on the CPU, which a graph cannot hold: called a synchronizing CUDA operation"
    )
    assert "capture_begin" not in fake.events and fake.events[-2:] == ["sync debug error", "sync debug 0"]


def test_a_recording_that_runs_the_step_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording that runs the step instead holds nothing: replaying it would repeat stale logits. Seen
    by the column moving while recording; the step is then redone eagerly from its start."""
    FakeCuda(monkeypatch, capture_begin=lambda: None, replay=lambda: None)
    eager, graphed, step = decode_both_ways(llama(), lambda decoder: CudaGraphStep(decoder, GraphRecorder()))
    assert torch.allclose(eager, graphed, atol=1e-6)
    assert step.reason == "the step ran while it was being recorded (the graph holds nothing)"


@pytest.mark.parametrize("fault", ["writes nothing", "wrong logits"])
def test_a_replay_that_fails_its_check_leaves_no_trace(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A recorded step whose replay disagrees with the eager step: the state goes back, the eager step
    runs again (the replay may have written a wrong key and value), and the call goes on eagerly with
    the eager-only decoding's logits."""
    decoders: list[StaticDecoder] = []
    placeholder: list[torch.Tensor] = []

    def step_of(decoder: StaticDecoder) -> CudaGraphStep:
        decoders.append(decoder)
        real = decoder.step

        def step() -> torch.Tensor:  # while recording, nothing runs: a tensor the replay would write
            if FakeCuda.recording:
                placeholder.append(torch.zeros(len(PROMPTS), len(VOCAB)))
                return placeholder[-1]
            return real()

        decoder.step = step  # type: ignore[method-assign]
        return CudaGraphStep(decoder, GraphRecorder())

    def begin() -> None:
        FakeCuda.recording = True

    def replay() -> None:  # a faulty replay: a wrong key at the column, the column moved
        decoder = decoders[-1]
        decoder.keys[0].index_fill_(2, decoder.column, 7.0)
        decoder.column.add_(1)
        decoder.position.add_(1)
        if fault == "wrong logits":
            placeholder[-1].copy_(torch.randn_like(placeholder[-1]))

    FakeCuda(monkeypatch, capture_begin=begin, replay=replay)
    eager, graphed, step = decode_both_ways(llama(), step_of)
    assert torch.allclose(eager, graphed, atol=1e-6)
    assert step.outcome == "graph dropped"
    assert "the graph's step differs from the eager one (relative error" in step.reason
    assert (step.check_error != step.check_error) == (fault == "writes nothing")  # NaN: nothing written


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_failed_recording_leaves_the_random_generator_usable() -> None:
    """What the first H200 run met (2026-11-29): a recording into the id of a pool whose graph was freed
    while its memory stays cached is refused by torch's allocator after ``capture_begin`` has marked the
    device's random generator as recording, and every later random draw raised. ragrl holds the last
    graph until the next recording has begun; after a failed recording it ends the generator's
    recording. (Recordings on a side stream: torch refuses the default one.)"""
    from ragrl.llm.static_decode import _end_generator_recording

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    pool, x = torch.cuda.graph_pool_handle(), torch.zeros(1, device="cuda")
    with torch.cuda.stream(side):
        first = torch.cuda.CUDAGraph()
        first.capture_begin(pool=pool)
        y = x + 1  # noqa: F841 - kept: the pool's memory outlives its graph
        first.capture_end()
        del first
        second = torch.cuda.CUDAGraph()
        try:
            second.capture_begin(pool=pool)
        except RuntimeError:
            refused = True
        else:
            second.capture_end()
            refused = False
    torch.cuda.current_stream().wait_stream(side)
    if not refused:
        pytest.skip(f"torch {torch.__version__} records into a freed graph's pool")
    try:
        torch.rand(1, device="cuda")
    except RuntimeError as e:
        assert "Offset increment outside graph capture" in str(e)
    else:
        pytest.skip(f"torch {torch.__version__} leaves no recording mark after a failed recording")
    assert _end_generator_recording(torch.device("cuda"), torch.cuda.Stream()) == ""
    assert torch.rand(1, device="cuda").item() < 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_graph_decodes_what_the_loop_does() -> None:
    """On a GPU: the recorded graph passes its check and replays the decoding step, in every call (40
    prompts: three batches, three graphs; the first H200 run dropped the second's, its pool named again).
    In float32 it gives the loop's generations; in bfloat16 the eager static step's (the same kernels;
    sampled sequences may part at a near tie, so 90% of them must be identical)."""
    tok = tokenizer()
    prompts = PROMPTS * 8
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5, stop=["w7 w8"])
    model = llama().to("cuda")
    graph = TransformersBackend(model, tok, decode="graph")
    loop = TransformersBackend(model, tok, decode="loop")
    assert_same(graph.generate(prompts, params), loop.generate(prompts, params))
    assert set(graph.decode_log) == {"graph"}
    model = model.to(torch.bfloat16)
    graph = TransformersBackend(model, tok, decode="graph")
    a = graph.generate(prompts, params)
    b = TransformersBackend(model, tok, decode="static").generate(prompts, params)
    assert sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True)) >= 0.9 * len(prompts)
    assert set(graph.decode_log) == {"graph"} and a[0].metadata["graph_check_error"] <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_graph_under_mixed_precision() -> None:
    """fp32 weights under bf16 autocast (the forward wrapped as accelerate wraps it for
    ``train.mixed_precision=bf16``): what the first H200 run's evaluations decoded. Every call records a
    graph that passes its check; the greedy tokens are the loop's for 90% of the prompts."""
    tok = tokenizer()
    prompts = PROMPTS * 8
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    model = llama().to("cuda")
    model.forward = torch.autocast("cuda", dtype=torch.bfloat16)(model.forward)
    graph = TransformersBackend(model, tok, decode="graph")
    a = graph.generate(prompts, params)
    b = TransformersBackend(model, tok, decode="loop").generate(prompts, params)
    assert sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True)) >= 0.9 * len(prompts)
    assert graph.decode_log == {"graph": 3}
