"""R²AG on the CPU: does GRPO through the RR-Forest rounds make the tiny steering policy retrieve better
on held-out questions than its warm start?

Per seed: the demo's substrate (``tiny_setup.world``: the seed's facts-split world, BM25, the tiny policy
with copy pre-training), then ``r2ag-tiny``: a partial SFT warm start on the steering oracle's tree steps
(``--sft-steps``), then GRPO with Eq. 5 through the rounds (``--steps``; training ends earlier if the
forest empties). Held-out: the answerable test questions (R²AG leaves out those whose evidence is not in
the corpus), whole trees, greedy, top-1, t = 2 (the world's questions have at most 3 hops). References on
the same questions: single-step retrieval SR@1/2/5 and the gold-decomposition oracle.

Arms: ``r2ag`` (the rounds, up to L_MAX-I = 5) and, with ``--ablation``, ``round0`` (one round only: the
policy only ever trains on root states, no gold context; ``rollout.rounds=1``).

    python benchmarks/r2ag_vs_warm_start.py --seeds 0 1 2 [--ablation]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_setup import add_comparison_args, compare_arm, print_results, resolve_base, run_comparison, world  # noqa: E402

COLUMNS = ("tree_recall", "tree_full_recall", "tree_map", "docs", "iterations", "invalid_steps", "stopped")
TRAINING = (
    "reward/r2ag_multi_hit",
    "reward/r2ag_joint_hit",
    "reward/r2ag_ap",
    "forest/round",
    "forest/finished",
)
ARMS = {"r2ag": [], "round0": ["rollout.rounds=1"]}


def references(workdir: Path, seed: int, copy_steps: int, base: Path | None = None) -> dict[str, Any]:
    """SR@1/2/5 and the oracle on the seed's held-out questions (scripted, through the same rollout)."""
    import dataclasses

    from ragrl.data.io import read_examples
    from ragrl.eval.runner import evaluate
    from ragrl.llm.hf_backend import load_tokenizer
    from ragrl.methods import load_method
    from ragrl.methods.r2ag.steering import SingleStepSteering, SteererBackend, SteeringOracle
    from ragrl.retrieval.base import load_retriever

    data, index, model_dir = world(workdir, seed, copy_steps, base=base)
    method = load_method("r2ag-tiny", ["rollout.max_new_tokens=200"])
    test = method.prepare_examples(read_examples(data / "test.jsonl")[0], "test")
    tokenizer, retriever = load_tokenizer(model_dir), load_retriever(index)
    out = {}
    for name, steerer, k in (("SR@1", SingleStepSteering(), 1), ("SR@2", SingleStepSteering(), 2),
                             ("SR@5", SingleStepSteering(), 5), ("oracle", SteeringOracle(), 1)):  # fmt: skip
        m = dataclasses.replace(method, eval_rollout=dataclasses.replace(method.eval_rollout, k=k))
        s = evaluate(SteererBackend(tokenizer, steerer), retriever, m, test).scores
        out[name] = {c: round(float(s[c]), 3) for c in COLUMNS if c in s}
    return out


def run(workdir: Path, seed: int, arm: str, args: argparse.Namespace) -> dict[str, Any]:
    result = compare_arm(
        workdir, seed, arm, "r2ag-tiny", ARMS[arm], sft_steps=args.sft_steps, steps=args.steps,
        copy_steps=args.copy_steps, columns=COLUMNS, training=TRAINING, extra=args.overrides,
        base=resolve_base(args.base),
    )  # fmt: skip
    if arm == "r2ag":
        result["references"] = references(workdir, seed, args.copy_steps, resolve_base(args.base))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_comparison_args(ap, sft_steps=150, steps=40)
    ap.add_argument("--ablation", action="store_true", help="also the one-round arm")
    args = ap.parse_args()
    arms = ["r2ag", "round0"] if args.ablation else ["r2ag"]
    results = run_comparison(args, arms, "ragrl-r2ag-", run)
    print_results(results, COLUMNS, TRAINING)
    for r in results:
        for name, ref in r.get("references", {}).items():
            print(
                f"| {r['seed']} | {name} | {r['n_test']} | reference | "
                + " | ".join(str(ref.get(c, "—")) for c in COLUMNS)
            )
    gains = [r["after"]["tree_recall"] - r["before"]["tree_recall"] for r in results if r["arm"] == "r2ag"]
    each = ", ".join(f"{g:+.3f}" for g in gains)
    mean = sum(gains) / len(gains)
    print(f"\nheld-out tree recall gain of r2ag over its warm start: mean {mean:+.3f} ({each})")


if __name__ == "__main__":
    main()
