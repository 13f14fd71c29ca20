"""vLLM rollout vs the transformers backend: multi-turn rollout tokens/s on the same model and batch.

    make vllm-env && .venv-vllm/bin/python benchmarks/vllm_rollout.py [--questions 32] [--n 4]
        [--repeats 3] [--hidden 128 --layers 4] [--model DIR] [--workdir DIR]

Setup: the synthetic world (seed 0, small), a BM25 index over it and the untrained tiny policy (or
``--model``), loaded twice: ``TransformersBackend`` (ragrl's decoding loop) and ``VLLMBackend`` (a vLLM
engine; fp32, eager, on a CPU vLLM's CPU build). Each side plays the same Search-R1 rollouts
(``RolloutEngine``: ``--questions`` dev questions x ``--n`` at temperature 1, a fixed seed) and the
policy tokens it generated are counted; tokens/s = those / the wall time of ``engine.run``. The two
engines sample with different random streams, so their rollouts differ; each side's work is the same in
every repeat. Warm-up once each, then ``--repeats`` interleaved pairs; best of N per side, medians too.

Also measured: one weight load into the engine (``VLLMBackend.load_weights`` of the whole state dict,
as a GRPO step with ``train.engine.sync_every: 1`` does) and the engine's start. The last line printed
is the ratio vLLM ÷ transformers of rollout tokens/s (median). ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch
from tiny_setup import add_model_args, open_workdir, world_and_policy

from ragrl.data.io import read_corpus, read_examples
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.methods import load_method
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.engine import RolloutEngine
from ragrl.train.rollout_engine import SyncedEngine


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--n", type=int, default=4, help="samples per question")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, default=None, help="a model folder (default: the tiny policy)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    add_model_args(ap)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's CPU default takes most of the RAM
    from ragrl.llm.vllm_backend import VLLMBackend

    tmp, workdir = open_workdir(args.workdir, "ragrl-vllm-rollout-")
    data, model_dir = world_and_policy(workdir, args.hidden, args.layers)
    model_dir = args.model or model_dir
    passages, _ = read_corpus(data / "corpus.jsonl")
    examples = read_examples(data / "dev.jsonl")[0][: args.questions]
    retriever = BM25Retriever.build(passages)
    method = load_method("search_r1")
    config = dataclasses.replace(method.rollout, temperature=1.0, seed=args.seed, n=args.n)
    hf = TransformersBackend(model_dir, device="cpu", dtype="float32")
    t0 = time.perf_counter()
    options = {"dtype": "float32", "enforce_eager": not torch.cuda.is_available(), "max_model_len": 2048}
    vllm = VLLMBackend(str(model_dir), **options)
    start_seconds = time.perf_counter() - t0
    synced = SyncedEngine(lambda: vllm, hf.model, hf.tokenizer)  # as GRPO's train.engine drives it
    sides = {
        "transformers": RolloutEngine(hf, retriever, method.protocol, config),
        "vllm": RolloutEngine(synced, retriever, method.protocol, config),
    }
    params = sum(p.numel() for p in hf.model.parameters())
    print(
        f"setup: {len(examples)} dev questions x n={args.n}, policy {params:,} parameters ({model_dir}), "
        f"max_turns={config.max_turns} max_new_tokens={config.max_new_tokens}, torch threads "
        f"{torch.get_num_threads()}, cpus {os.cpu_count()}; vLLM engine started in {start_seconds:.1f} s"
    )
    try:
        figures = _measure(
            args, sides, synced, hf, examples, {"parameters": params, "engine_start_s": start_seconds}
        )
    finally:
        synced.close()
    if tmp is not None:
        tmp.cleanup()
    return figures


def _measure(args, sides, synced, hf, examples, setup) -> dict:  # noqa: ANN001
    tokens: dict[str, int] = {}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, engine in sides.items():
            # every repeat from cold caches: the same prompts again would find their prefixes cached
            hf.clear_prefix_cache()
            synced.backend.clear_prefix_cache()
            t0 = time.perf_counter()
            trajectories = engine.run(examples, n=args.n, seed=args.seed)
            dt = time.perf_counter() - t0
            work = sum(t.num_policy_tokens for t in trajectories)
            if repeat == 0:
                tokens[name] = work
                turns = statistics.mean(len(t.actions) for t in trajectories)
                print(f"{name}: {len(trajectories)} trajectories, {work:,} policy tokens, {turns:.2f} turns")
                continue
            assert work == tokens[name], f"{name}: the rollout's work changed between repeats"
            seconds[name].append(dt)
    sync_seconds = synced.sync(0)
    figures = {"questions": len(examples), "n": args.n, **setup}
    figures["weight_sync_s"] = sync_seconds
    for name in sides:
        best, median = min(seconds[name]), statistics.median(seconds[name])
        figures[name] = {
            "policy_tokens": tokens[name],
            "tokens_per_s_best": round(tokens[name] / best, 1),
            "tokens_per_s_median": round(tokens[name] / median, 1),
        }
        print(
            f"{name:>12}: {tokens[name] / best:8.1f} tokens/s (best of {args.repeats}; median "
            f"{tokens[name] / median:.1f})"
        )
    ratio = figures["vllm"]["tokens_per_s_median"] / figures["transformers"]["tokens_per_s_median"]
    figures["vllm_over_transformers"] = round(ratio, 2)
    print(f"weight load into the engine: {sync_seconds:.3f} s ({len(hf.model.state_dict())} tensors)")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(f"rollout tokens/s, vLLM / transformers (median): {ratio:.2f}")
    return figures


if __name__ == "__main__":
    main()
