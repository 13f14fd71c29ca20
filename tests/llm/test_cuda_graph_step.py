"""Decoding steps recorded as CUDA graphs (``decode="graph"``, ``CudaGraphStep``): on a CPU, the fallbacks
around a recording with torch's CUDA calls replaced by stand-ins (a failed recording, a step that waits on
the CPU, a recording that runs the step, a replay that disagrees, the backend's pool and held graph, the
random generator); on a GPU, the real graphs against the loop (the GPU-marked tests)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ragrl.llm.backend import SamplingParams
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.llm.static_decode import CudaGraphStep, GraphRecorder, StaticDecoder

# the static decoder's own tests hold the models, prompts and prefill these tests decode with
_spec = importlib.util.spec_from_file_location(
    "static_decode_tests", Path(__file__).parent / "test_static_decode.py"
)
_static = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_static)
PROMPTS, VOCAB, assert_same, llama, prefill, tokenizer = (
    _static.PROMPTS,
    _static.VOCAB,
    _static.assert_same,
    _static.llama,
    _static.prefill,
    _static.tokenizer,
)


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
                events.append("capture_end")
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


@pytest.mark.parametrize("end_fails", [False, True])
def test_an_interrupt_while_recording_ends_the_recording(
    monkeypatch: pytest.MonkeyPatch, end_fails: bool
) -> None:
    """Ctrl-C while the step is being recorded (in a notebook the process goes on): the recording is
    ended, and if ending it fails, the allocator stops routing to the pool and the random generator's
    mark is taken off by the trivial recording; the interrupt passes on."""

    def end() -> None:
        if end_fails:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    begin = lambda: setattr(FakeCuda, "recording", True)  # noqa: E731
    fake = FakeCuda(monkeypatch, capture_begin=begin, replay=lambda: None, capture_end=end)

    def step_of(decoder: StaticDecoder) -> CudaGraphStep:
        real = decoder.step

        def step() -> torch.Tensor:
            if FakeCuda.recording:
                raise KeyboardInterrupt
            return real()

        decoder.step = step  # type: ignore[method-assign]
        return CudaGraphStep(decoder, GraphRecorder())

    with pytest.raises(KeyboardInterrupt):
        decode_both_ways(llama(), step_of)
    assert not FakeCuda.recording and not FakeCuda.generator_recording
    assert fake.events.count("capture_begin") == (2 if end_fails else 1)  # the trivial one after a failed end
    assert fake.events.count("capture_end") == fake.events.count("capture_begin")  # each recording ended once
    assert fake.events.count("end pool") == int(end_fails)


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
