"""Generation from FSDP-sharded weights, two ways, on 2 CPU processes: gather the whole model once for
the rollout phase (``FullyShardedParallel.generating``, what the trainers do) against leaving FSDP to
gather each layer in every forward of every generated token.

A randomly initialised model of ``--shape`` (``gpu_shapes.SHAPES``; ``--layers`` / ``--vocab`` as in
``sharding_memory.py``) is sharded with ``train.parallel.mode=fsdp`` over ``torchrun --nproc_per_node 2``.
Both processes then generate for the same ``--prompts`` questions of the synthetic world, greedy,
``--new-tokens`` tokens (the same prompts and weights on both, so their forwards stay in step, which the
per-layer way needs: its gathers are collective). Each process reports the seconds and its peak RSS
after each way (the per-layer way first, so its peak is its own); the last line is the ratio of the
times. The generations of the two ways are checked equal.

    python benchmarks/sharded_generation.py [--shape smollm2-135m] [--prompts 16] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def child(args: argparse.Namespace) -> None:
    """One process: shard, then generate both ways; writes its figures to the work folder."""
    import torch

    from ragrl.data.io import read_examples
    from ragrl.llm.backend import SamplingParams
    from ragrl.llm.hf_backend import TransformersBackend, load_tokenizer
    from ragrl.methods import load_method
    from ragrl.train.parallel import make_parallel
    from ragrl.train.setup import load_policy, make_accelerator

    work = args.workdir
    method = load_method("search_r1-tiny", [f"train.model.path={work / 'model'}", "train.parallel.mode=fsdp",
                                            "train.model.dtype=float32"])  # fmt: skip
    acc = make_accelerator(method.train)
    parallel = make_parallel(acc, method.train)
    model, _ = load_policy(method.train.model, acc.device)
    model, _ = parallel.prepare(model, lambda m: torch.optim.AdamW(m.parameters()))
    tokenizer = load_tokenizer(work / "model")
    backend = TransformersBackend(model, tokenizer, batch_size=args.prompts, prefix_cache_mb=0)
    questions = read_examples(work / "world" / "train.jsonl")[0][: args.prompts]
    prompts = [tokenizer(f"Question: {q.question}")["input_ids"] for q in questions]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    figures = {}
    outputs = {}
    for way in ("per_layer", "once"):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        if way == "once":
            with parallel.generating(model, backend):
                generations = backend.generate(prompts, params)
        else:
            generations = backend.generate(prompts, params)
        seconds = time.perf_counter() - t0
        outputs[way] = [g.token_ids for g in generations]
        tokens = sum(len(g.token_ids) for g in generations)
        peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        figures[way] = {"seconds": round(seconds, 2), "tokens": tokens, "peak_mb": peak}
    figures["same_tokens"] = outputs["per_layer"] == outputs["once"]
    (work / f"generation-{acc.process_index}.json").write_text(json.dumps(figures))
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from sharding_memory import setup
    from tiny_setup import open_workdir

    tmp, args.workdir = open_workdir(args.workdir, "ragrl-sharded-generation-")
    n = setup(args.workdir, args.shape, args.layers, args.vocab)
    print(f"{args.shape}: {n / 1e6:.0f}M parameters, fp32, FSDP over 2 processes (gloo); "
          f"{args.prompts} prompts × {args.new_tokens} new tokens, greedy")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               __file__, "--child", "--workdir", str(args.workdir), "--prompts", str(args.prompts),
               "--new-tokens", str(args.new_tokens)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    files = sorted(args.workdir.glob("generation-*.json"))
    if done.returncode != 0 or len(files) != 2:
        sys.exit(f"failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(f.read_text()) for f in files]
    for rank, r in enumerate(rows):
        for way, label in (("per_layer", "gathered per layer, every forward"), ("once", "gathered once")):
            f = r[way]
            print(f"process {rank}, {label}: {f['seconds']} s, {f['tokens'] / f['seconds']:.1f} tokens/s, "
                  f"peak RSS so far {f['peak_mb']:,} MB")  # fmt: skip
        print(f"process {rank}: the two ways generated the same tokens: {r['same_tokens']}")
    slow = max(r["per_layer"]["seconds"] for r in rows)
    fast = max(r["once"]["seconds"] for r in rows)
    if tmp is not None:
        tmp.cleanup()
    print(f"generation time, per-layer gathers / gathered once: {slow / fast:.1f}")


if __name__ == "__main__":
    main()
