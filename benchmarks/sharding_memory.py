"""Per-process peak memory of the same training run under DDP, FSDP2 and DeepSpeed ZeRO-2 / ZeRO-3, on 2 CPU
processes.

A randomly initialised model of a paper's shape (``--shape``, from ``gpu_shapes.SHAPES``: Qwen2.5-0.5B by
default, its 151,936-token vocabulary and tied embeddings; ``--layers`` keeps fewer of its decoder layers
where the whole model does not fit twice in the machine's memory under DDP, ``--vocab`` sets the embedding's
rows, e.g. Llama-2's 32,000) is written once to a work folder; then ``torchrun --nproc_per_node 2`` runs the
same SFT steps on it under each of ``--modes`` (AdamW, fp32, the quoting oracle's demonstrations of the
synthetic world, ``--steps`` steps of ``--batch`` demonstrations). Each process reports its peak resident
memory (``ru_maxrss``) after the steps; the last lines are the ratios to DDP of the larger of the two
processes' peaks (issue 38 asked FSDP for at most 0.6). Activation checkpointing is on, as in every paper
config (``--no-checkpointing``: off).

    python benchmarks/sharding_memory.py [--shape qwen2.5-0.5b] [--layers 16] [--vocab 32000] [--steps 3]
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


MODES = {
    "ddp": ["train.parallel.mode=ddp"],
    "fsdp": ["train.parallel.mode=fsdp"],
    "zero2": ["train.parallel.mode=deepspeed", "train.parallel.zero_stage=2"],
    "zero3": ["train.parallel.mode=deepspeed", "train.parallel.zero_stage=3"],
}


def high_water_mb() -> int:
    """The process's peak resident memory so far (MB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def child(args: argparse.Namespace) -> None:
    """One process of a run: SFT steps under ``args.mode``; prints its peak RSS as a JSON line."""
    import torch

    from ragrl.data.io import read_examples
    from ragrl.llm.hf_backend import load_tokenizer
    from ragrl.methods import load_method
    from ragrl.retrieval.base import load_retriever
    from ragrl.synth.demonstrators import QuotingOracle
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    work = args.workdir
    method = load_method(
        "search_r1-tiny",
        [f"train.model.path={work / 'model'}", f"train.out={work / args.mode}",
         *MODES[args.mode], f"train.sft.batch_size={args.batch}",
         f"train.sft.max_steps={args.steps}", "train.grpo.micro_batch_size=2", "train.model.dtype=float32",
         f"train.model.gradient_checkpointing={str(args.checkpointing).lower()}",
         "protocol.user='Question: {question}'"],
    )  # fmt: skip
    tokenizer = load_tokenizer(work / "model")  # the tokenizer only: a model loaded here would count too
    examples = read_examples(work / "world" / "train.jsonl")[0][: args.batch]
    retriever = load_retriever(work / "world" / "bm25")
    demos = demonstration_trajectories(method, tokenizer, QuotingOracle(), examples, retriever)
    phases = {"start": high_water_mb()}
    trainer = SFTTrainer(method, method.train, demos, eval_examples=[])
    phases["prepared"] = high_water_mb()  # the model loaded and placed (sharded) with its optimizer
    t0 = time.perf_counter()
    for step in range(args.steps):
        trainer.step()
        phases[f"step {step + 1}"] = high_water_mb()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rank = trainer.acc.process_index  # a file each: two processes' lines interleave on one stdout
    (work / f"peak-{args.mode}-{rank}.json").write_text(json.dumps(
        {"mode": args.mode, "rank": rank, "peak_mb": round(peak), "seconds": round(seconds, 1),
         "high_water_mb": phases}))  # fmt: skip
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def setup(work: Path, shape: str, layers: int | None = None, vocab: int | None = None) -> int:
    """The world, its index and the random model of ``shape``, with its first ``layers`` decoder layers
    only and a ``vocab``-token embedding when given (its parameter count)."""
    import torch
    from gpu_shapes import build
    from transformers import AutoTokenizer

    from ragrl.data.io import read_corpus
    from ragrl.retrieval.bm25 import BM25Retriever
    from ragrl.synth import generate_world
    from ragrl.train.reader import SHIPPED_BASE

    if not (work / "world" / "train.jsonl").is_file():
        generate_world(0, "small").write(work / "world")
        BM25Retriever.build(read_corpus(work / "world" / "corpus.jsonl")[0]).save(work / "world" / "bm25")
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_BASE, local_files_only=True)
    model = build(shape, torch.device("cpu"), torch.float32, tokenizer, **({"vocab": vocab} if vocab else {}))
    if layers is not None:
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        model.config.layer_types = model.config.layer_types[:layers]
    n = sum(p.numel() for p in model.parameters())
    saved = work / "model" / "config.json"
    if saved.is_file() and json.loads(saved.read_text()).get("num_parameters") != n:
        raise SystemExit(f"{work}: holds a model of another shape; use another --workdir")
    if not saved.is_file():
        model.config.num_parameters = n  # recorded, so a reused work folder is checked
        model.save_pretrained(work / "model")
        tokenizer.save_pretrained(work / "model")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=None, help="keep the shape's first N decoder layers")
    ap.add_argument(
        "--vocab", type=int, default=None,
        help="the embedding's rows (default: the shape's; 32000 is Llama-2's; at least the tokenizer's 8192)",
    )  # fmt: skip
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument(
        "--checkpointing", action=argparse.BooleanOptionalAction, default=True,
        help="activation checkpointing, as every paper config has it (--no-checkpointing: off)",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="demonstrations per step (2 per process)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode is not None:
        return child(args)
    from tiny_setup import open_workdir

    tmp, args.workdir = open_workdir(args.workdir, "ragrl-sharding-")
    n = setup(args.workdir, args.shape, args.layers, args.vocab)
    name = (
        args.shape
        + (f", {args.layers} layers" if args.layers else "")
        + (f", vocabulary {args.vocab}" if args.vocab else "")
    )
    print(f"{name}: {n / 1e6:.0f}M parameters (fp32 {4 * n / 2**30:.2f} GiB), 2 processes, gloo")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true", "PYTHONUNBUFFERED": "1"}
    peaks = {}
    for mode in args.modes:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   __file__, "--mode", mode, "--workdir", str(args.workdir), "--steps", str(args.steps),
                   "--batch", str(args.batch),
                   "--checkpointing" if args.checkpointing else "--no-checkpointing"]  # fmt: skip
        for old in args.workdir.glob(f"peak-{mode}-*.json"):
            old.unlink()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        rows = [json.loads(f.read_text()) for f in sorted(args.workdir.glob(f"peak-{mode}-*.json"))]
        if done.returncode != 0 or len(rows) != 2:
            sys.exit(f"{mode} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        for r in rows:
            print(
                f"{mode}: process {r['rank']} peak RSS {r['peak_mb']:,} MB, {args.steps} steps in "
                f"{r['seconds']} s; high-water mark by phase: "
                + ", ".join(f"{k} {v:,}" for k, v in r["high_water_mb"].items())
            )
        peaks[mode] = max(r["peak_mb"] for r in rows)
    if tmp is not None:
        tmp.cleanup()
    for mode in args.modes:
        if mode != "ddp" and "ddp" in peaks:
            print(f"per-process peak RSS, {mode} / ddp: {peaks[mode] / peaks['ddp']:.2f}")


if __name__ == "__main__":
    main()
