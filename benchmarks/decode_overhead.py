"""What one decoding step costs in operations and time: the plain loop against the static step.

    .venv/bin/python benchmarks/decode_overhead.py [--rows 16] [--prompt 64] [--new 32] [--repeats 3]

A model of SmolLM2-135M's shape (Llama: 30 layers, hidden 576, 9 heads, 3 KV heads, vocabulary 49,152,
tied embeddings) with random weights, float32, decodes ``--rows`` random left-padded prompts (lengths
from half of ``--prompt`` to all of it) for ``--new`` tokens through ``TransformersBackend``, with
``decode="loop"`` (the model's forward with a growing cache) and ``decode="static"`` (the model's
decoder layers over static buffers: the step a GPU records as one CUDA graph; ragrl.llm.static_decode).
Both sample from the same seeds and must give the same tokens (else the script exits nonzero).

* **operations a step**: torch's profiler counts the aten operations of one call (outermost ones only:
  an operation called inside another is not counted again) and divides by the decoding steps, after
  subtracting a call of one new token (the prefill and the call's set-up). On a GPU each is at least one
  kernel launch and a round of Python: the cost a CUDA graph replaces with one launch.
* **seconds a step**: the same difference in wall time, best of ``--repeats`` interleaved pairs.

On a CPU the arithmetic of a step at this size is not small against its overhead, so the time ratio
says less than the operation count; the CUDA graph itself runs only on a GPU (docs/performance.md).
The last line printed is the loop ÷ static ratio of operations a step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def build(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100_000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def prompts(rows: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(length // 2, length, rows).round().long().tolist()
    return [torch.randint(10, 40_000, (n,), generator=g).tolist() for n in lengths]


def operations(backend: object, batch: list[list[int]], params: object) -> int:
    """Outermost aten operations of one ``generate`` call."""
    from torch.profiler import ProfilerActivity, profile

    saved = os.dup(2)  # the profiler's native start/stop lines go to stderr: not to the terminal
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                backend.generate(batch, params)  # type: ignore[attr-defined]
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    # outermost: not inside another aten event of the same thread
    events.sort(key=lambda e: (e.thread, e.time_range.start, -e.time_range.end))
    count, end, thread = 0, -1.0, None
    for e in events:
        if e.thread != thread:
            thread, end = e.thread, -1.0
        if e.time_range.start >= end:
            count += 1
            end = e.time_range.end
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from ragrl.llm.backend import SamplingParams
    from ragrl.llm.hf_backend import TransformersBackend
    from ragrl.train.reader import SHIPPED_BASE

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = build()
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_BASE, local_files_only=True)
    batch = prompts(args.rows, args.prompt)
    full = SamplingParams(max_new_tokens=args.new, temperature=1.0, seed=0)
    one = SamplingParams(max_new_tokens=1, temperature=1.0, seed=0)
    modes = ("loop", "static")
    backends = {
        m: TransformersBackend(model, tokenizer, batch_size=args.rows, prefix_cache_mb=0, decode=m)
        for m in modes
    }
    outputs = {m: backends[m].generate(batch, full) for m in modes}  # the warm-up, and the same tokens
    if any(a.token_ids != b.token_ids for a, b in zip(outputs["loop"], outputs["static"], strict=True)):
        sys.exit("decode_overhead: the loop and the static step generated different tokens")
    steps = min(len(g.token_ids) for g in outputs["loop"]) - 1
    ops = {
        m: (operations(backends[m], batch, full) - operations(backends[m], batch, one)) / steps for m in modes
    }
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for m in modes:
            t0 = time.perf_counter()
            backends[m].generate(batch, one)
            t1 = time.perf_counter()
            backends[m].generate(batch, full)
            t2 = time.perf_counter()
            seconds[m].append(((t2 - t1) - (t1 - t0)) / steps)
    print(f"SmolLM2-135M shape, random weights, float32 on CPU ({torch.get_num_threads()} threads)")
    print(f"{args.rows} rows, prompts of {args.prompt // 2}-{args.prompt} tokens, {args.new} new tokens")
    print("the same tokens both ways (checked)")
    print(f"| decode | aten operations a step | ms a step (best of {args.repeats}) |")
    print("|---|---|---|")
    for m in modes:
        print(f"| {m} | {ops[m]:.0f} | {1000 * min(seconds[m]):.1f} |")
    print(f"time a step, loop ÷ static: {min(seconds['loop']) / min(seconds['static']):.2f}")
    print(f"operations a step, loop ÷ static: {ops['loop'] / ops['static']:.2f}")


if __name__ == "__main__":
    main()
