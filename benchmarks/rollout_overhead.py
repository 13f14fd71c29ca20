"""Rollout overhead: multi-turn rollout throughput vs plain batched generation, same backend and model.

    .venv/bin/python benchmarks/rollout_overhead.py [--questions 32] [--n 2] [--repeats 3] [--workdir DIR]

Setup (in a temp dir, or ``--workdir`` to keep and reuse it): the synthetic world (seed 0, small), a
BM25 index over its corpus and the untrained tiny policy, loaded with ``TransformersBackend`` on CPU.

* rollout: ``RolloutEngine`` with the Search-R1 protocol and rollout config (temperature 1.0, fixed
  seed, so every repeat does the same work) over ``--questions`` dev questions x ``--n``; the whole
  ``engine.run`` is timed (generation, stop-string matching, parsing, retrieval, observation
  tokenization, bookkeeping). Policy tokens = sum of ``Trajectory.num_policy_tokens``.
* plain: the same backend, ONE ``generate`` call over the same prompts (the protocol's ``prompt_ids``,
  each ``n`` times), the same sampling params (temperature, top-p/k, seed; no stop strings, so each
  sequence runs to the same number of tokens unless it emits EOS) and the same backend batch size,
  with ``max_new_tokens`` = the rollout's mean policy tokens per trajectory, so both sides generate
  about the same number of policy tokens. Throughput = tokens / seconds.

What the ratio includes on purpose: each rollout turn re-sends the whole context (prompt + earlier
turns + observations); the backend's prefix cache reuses the KV cache of the previous turn and
prefills only the new tokens (the last generated token and the observation), but every later token
still attends over the observations, which a plain generation never has. That is a real cost of
multi-turn rollouts.
An untrained policy rarely closes a tag, so most turns run to ``max_new_tokens`` and get the
corrective observation: the episodes are multi-turn (mean turns printed), with few real searches.

Warm-up once each, then ``--repeats`` interleaved pairs; best of N per side (the median is printed
too). Also printed: tokens/s of each rollout turn (it falls as the context grows) and, as a diagnostic
outside the ratio, how many context tokens the prefix cache saved from being prefilled again.
``--profile`` adds a cProfile of one engine run. The last line printed is the ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import os
import pstats
import statistics
import sys
import time
from collections import Counter

import torch
from tiny_setup import add_model_args, open_workdir, world_and_policy

from ragrl.data.io import read_corpus, read_examples
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.methods import load_method
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.engine import RolloutEngine


class TimedBackend:
    """Forwards ``generate`` to a backend and adds up the seconds spent in it."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.calls: list[dict] = []

    def reset(self) -> None:
        self.calls = []

    @property
    def seconds(self) -> float:
        return sum(c["seconds"] for c in self.calls)

    def generate(self, prompts, params):
        t0 = time.perf_counter()
        gens = self.backend.generate(prompts, params)
        lens = [len(p) for p in prompts]
        self.calls.append(
            {
                "seconds": time.perf_counter() - t0,
                "prompts": len(prompts),
                "mean_context": sum(lens) / len(lens),
                "max_context": max(lens),
                "context_tokens": sum(lens),
                "tokens": sum(len(g.token_ids) for g in gens),
            }
        )
        return gens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--n", type=int, default=2, help="samples per question")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile one engine run, print the top")
    add_model_args(ap)
    args = ap.parse_args()

    tmp, workdir = open_workdir(args.workdir, "ragrl-rollout-overhead-")
    t_setup = time.perf_counter()
    data, model_dir = world_and_policy(workdir, args.hidden, args.layers)
    passages, _ = read_corpus(data / "corpus.jsonl")
    examples, _ = read_examples(data / "dev.jsonl")
    examples = examples[: args.questions]
    retriever = BM25Retriever.build(passages)
    backend = TransformersBackend(model_dir, device="cpu")
    method = load_method("search_r1")
    config = dataclasses.replace(method.rollout, temperature=1.0, seed=args.seed, n=args.n)
    timed = TimedBackend(backend)
    engine = RolloutEngine(timed, retriever, method.protocol, config)
    print(
        f"setup: {len(passages):,} passages, {len(examples)} dev questions x n={args.n}, "
        f"tiny policy {sum(p.numel() for p in backend.model.parameters()):,} params, "
        f"backend batch {backend.batch_size}, torch threads {torch.get_num_threads()}, "
        f"cpus {os.cpu_count()} ({time.perf_counter() - t_setup:.1f} s)"
    )
    print(
        f"rollout config: max_turns={config.max_turns} max_new_tokens={config.max_new_tokens} "
        f"max_total_tokens={config.max_total_tokens} k={config.k} T={config.temperature} "
        f"stop={list(method.protocol.stop)}"
    )

    cpu = {"rollout": [], "plain": []}  # process CPU seconds: steadier than wall time on a shared machine

    def run_rollout():
        timed.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        trajs = engine.run(examples, n=args.n, seed=args.seed)
        cpu["rollout"].append(time.process_time() - c0)
        return trajs, time.perf_counter() - t0

    # warm-up + the workload (identical in every repeat: fixed seed)
    trajs, _ = run_rollout()
    n_traj = len(trajs)
    policy_tokens = sum(t.num_policy_tokens for t in trajs)
    env_tokens = sum(len(t.completion_ids) for t in trajs) - policy_tokens
    turns = [len(t.actions) for t in trajs]
    per_seq = max(1, round(policy_tokens / n_traj))
    prompts = [
        list(method.protocol.prompt_ids(ex, backend.tokenizer)) for ex in examples for _ in range(args.n)
    ]
    plain_params = config.sampling(per_seq, (), args.seed)

    def run_plain():
        t0, c0 = time.perf_counter(), time.process_time()
        gens = backend.generate(prompts, plain_params)
        cpu["plain"].append(time.process_time() - c0)
        return sum(len(g.token_ids) for g in gens), time.perf_counter() - t0

    plain_tokens, _ = run_plain()  # warm-up

    t_roll, t_plain, calls = [], [], []
    for _ in range(args.repeats):
        again, dt = run_rollout()
        assert sum(t.num_policy_tokens for t in again) == policy_tokens, "rollout work changed"
        t_roll.append(dt)
        calls.append(timed.calls)
        tok, dt = run_plain()
        assert tok == plain_tokens, "plain work changed"
        t_plain.append(dt)

    best = t_roll.index(min(t_roll))
    best_calls = calls[best]
    t_gen = sum(c["seconds"] for c in best_calls)
    ctx_tokens = sum(c["context_tokens"] for c in best_calls)
    tps_roll, tps_plain = policy_tokens / min(t_roll), plain_tokens / min(t_plain)
    med_roll, med_plain = policy_tokens / statistics.median(t_roll), plain_tokens / statistics.median(t_plain)
    reasons = Counter(t.finish_reason for t in trajs)
    searches = sum(t.num_searches for t in trajs)
    prompt_len = sum(len(p) for p in prompts) / len(prompts)
    print(
        f"trajectories: {n_traj}; mean turns: {statistics.mean(turns):.2f} "
        f"(min {min(turns)}, max {max(turns)}); searches: {searches}; "
        f"finish: {dict(sorted(reasons.items()))}"
    )
    print(
        f"policy tokens: {policy_tokens:,} ({policy_tokens / n_traj:.0f}/trajectory); env tokens: "
        f"{env_tokens:,}; prompt {prompt_len:.0f} tokens; rollout re-sent {ctx_tokens:,} context tokens "
        f"in {len(best_calls)} generate calls"
    )
    print(
        f"plain generation: {plain_tokens:,} tokens ({per_seq} max new tokens x {len(prompts)} prompts, "
        f"1 generate call)"
    )
    print(
        f"rollout: {tps_roll:8.1f} tokens/s (best of {args.repeats}; median {med_roll:.1f}); "
        f"{t_gen / t_roll[best]:.1%} of the run inside backend.generate"
    )
    for turn, c in enumerate(best_calls):
        print(
            f"  turn {turn}: {c['prompts']:3d} prompts, context mean {c['mean_context']:4.0f} / max "
            f"{c['max_context']:4d} tokens, {c['tokens']:6,} generated, "
            f"{c['tokens'] / c['seconds']:7.1f} tokens/s"
        )
    print(f"plain:   {tps_plain:8.1f} tokens/s (best of {args.repeats}; median {med_plain:.1f})")
    print(f"median ratio: {med_roll / med_plain:.2f}")
    cpu_roll = policy_tokens / statistics.median(cpu["rollout"][-args.repeats :])
    cpu_plain = plain_tokens / statistics.median(cpu["plain"][-args.repeats :])
    print(
        f"per CPU second (median): rollout {cpu_roll:.1f}, plain {cpu_plain:.1f} tokens; "
        f"ratio {cpu_roll / cpu_plain:.2f}"
    )

    # Diagnostic (not part of the ratio): context tokens the prefix cache did not prefill again.
    hits_before, reused_before = backend.prefix_cache.hits, backend.prefix_cache.hit_tokens
    run_rollout()
    print(
        f"prefix cache: {backend.prefix_cache.hits - hits_before} continued sequences, "
        f"{backend.prefix_cache.hit_tokens - reused_before:,} of {ctx_tokens:,} context tokens "
        "not prefilled again"
    )

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        engine.run(examples, n=args.n, seed=args.seed)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        print("\n".join(buf.getvalue().splitlines()[:40]))

    if tmp is not None:
        tmp.cleanup()
    sys.stdout.flush()
    print(f"rollout/plain generation tokens-per-second ratio: {tps_roll / tps_plain:.2f}")


if __name__ == "__main__":
    main()
