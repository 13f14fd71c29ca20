"""ARENA vs the Naive-GRPO baseline on the CPU: the same tiny policy, world, warm-start budget and GRPO
budget, different output format and rewards (ARENA spec §7.2 item 4d).

For each seed: the synthetic world (the default ``facts`` split; given-passages mode: each question
comes with its ~10 passages; the gold reference ids are attached with ARENA's rule and unresolvable
questions, the unanswerable ones, are dropped), one tiny policy with the demo's copy pre-training
(``--copy-steps``); then for each of ``arena-tiny`` and ``arena-naive-tiny``:

1. a partial SFT warm start on the method's own oracle replies (``--sft-steps``);
2. GRPO with the method's rewards (``--steps``);
3. held-out evaluation of the warm start and of the trained policy (greedy, ARENA normalization):
   EM, the most common answer's share (the collapse check), format score, and for ARENA the
   relevance score, cited-id precision / recall and bonus rate.

The last line is the headline: held-out EM after GRPO, ARENA vs Naive, averaged over the seeds.

    python benchmarks/arena_vs_naive.py --seeds 0 [--sft-steps 120] [--steps 30] [--copy-steps 1500]
        [--workdir DIR] [--base scratch|shipped|DIR]

With ``--base shipped`` (or a reader-base folder) both methods start from the pretrained reader base
instead of a per-seed tiny policy, with the demo's recipe, their token limits scaled for its BPE and the
base's passages-then-question prompt (``ragrl.train.from_base.base_overrides``); their oracles' replies then
name each hop's entity and passage number and quote the passage through its evidence sentence
(``base_demonstrator``). A base that read
in their grammar too is ``ragrl model reader --init shipped --also arena-tiny --also arena-naive-tiny``
(docs/arena.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tiny_setup import (
    base_demonstrator,
    base_overrides,
    open_workdir,
    resolve_base,
    warm_start_then_grpo,
    world,
)

from ragrl.data.io import read_examples
from ragrl.data.references import attach_reference_ids
from ragrl.eval.runner import collapse_check, evaluate
from ragrl.methods import load_method
from ragrl.train.demo import DEFAULT_COPY_STEPS

METHODS = {"arena": "arena-tiny", "naive": "arena-naive-tiny"}
VARIANT = "arena"  # ARENA's answer normalisation (arm_outcomes.py replays with it too)
COLUMNS = ("em", "top_answer_share", "reward/arena_format", "reward/think_answer_format",
           "reward/arena_relevance", "cite/precision", "cite/recall", "bonus_rate")  # fmt: skip


def scores(backend, method, examples) -> dict[str, float]:  # noqa: ANN001
    report = evaluate(backend, None, method, examples, variant=VARIANT)
    out = {k: round(float(report.scores[k]), 3) for k in COLUMNS if k in report.scores}
    check = collapse_check(report.rows, examples)  # the collapse check: the most common answer's share
    out["top_answer_share"] = round(check["eval/top_answer_share"], 3)
    out["top_answer"] = check["eval/top_answer"]
    return out


def run(
    workdir: Path, seed: int, name: str, sft_steps: int, steps: int, copy_steps: int, extra: list[str],
    base: Path | None = None,
) -> dict:  # fmt: skip
    data, _, model_dir = world(workdir, seed, copy_steps, base=base)
    limits = base_overrides(METHODS[name], extra) if base is not None else []
    train, _ = attach_reference_ids(read_examples(data / "train.jsonl")[0])
    test, _ = attach_reference_ids(read_examples(data / "test.jsonl")[0])
    out = workdir / f"{name}-{seed}"
    method = load_method(
        METHODS[name],
        [*limits, f"train.seed={seed}", f"train.model.path={model_dir}", f"train.out={out}",
         f"train.sft.max_steps={sft_steps}", f"train.steps={steps}", "train.eval_every=0",
         f"train.sft.world={data / 'world.json'}", *extra],  # the names train.sft.name_swap swaps
    )  # fmt: skip
    t0 = time.perf_counter()
    demonstrator = base_demonstrator(method) if base is not None else method.oracle
    grpo = warm_start_then_grpo(method, demonstrator, train, None, out)
    before = scores(grpo.backend, method, test)
    grpo.train()
    after = scores(grpo.backend, method, test)
    return {"seed": seed, "method": name, "n_test": len(test), "before": before, "after": after,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--sft-steps", type=int, default=120)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--copy-steps", type=int, default=DEFAULT_COPY_STEPS, help="copy pre-training (as the demo)"
    )
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--base", default="scratch",
        help="scratch (a tiny policy per world: the docs' tables), shipped (the reader base) or a folder",
    )  # fmt: skip
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override (both)")
    args = ap.parse_args()
    base = resolve_base(args.base)
    tmp, workdir = open_workdir(args.workdir, "ragrl-arena-vs-naive-")
    results = []
    for seed in args.seeds:
        for name in METHODS:
            r = run(workdir, seed, name, args.sft_steps, args.steps, args.copy_steps, args.overrides, base)
            results.append(r)
            print(json.dumps(r), flush=True)
    (workdir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    print(f"\n| seed | method | questions | phase | {' | '.join(COLUMNS)} |")
    print("|---|---|---|---|" + "---|" * len(COLUMNS))
    for r in results:
        for phase in ("before", "after"):
            cells = " | ".join(str(r[phase].get(k, "—")) for k in COLUMNS)
            print(f"| {r['seed']} | {r['method']} | {r['n_test']} | {phase} | {cells} |")
    em = {name: statistics.mean(r["after"]["em"] for r in results if r["method"] == name) for name in METHODS}
    if tmp is not None:
        tmp.cleanup()
    print(
        f"held-out EM after GRPO over seeds {args.seeds}: ARENA {em['arena']:.3f} vs Naive-GRPO "
        f"{em['naive']:.3f} ({100 * (em['arena'] - em['naive']):+.1f} points)"
    )


if __name__ == "__main__":
    main()
