"""TIRESRAG-R1 vs Search-R1 on the CPU, from a partial warm start (TIRESRAG spec §7.2 item 4).

For each seed: the synthetic world (seed-specific, the default ``facts`` split), its BM25 index and one
tiny policy with the demo's copy pre-training (``--copy-steps``); then for each arm

* ``search_r1``: Search-R1's prompt, the EM reward, group z-scores, zero-variance groups dropped;
* ``tiresrag``: think-retrieve-reflect, R_sum = R^A + a_t (0.6 R^T + 0.3 R^S + 0.3 R^R) with the
  offline judge proxy, the consistency penalty and the difficulty weight, the saturated-group filter
  (``tiresrag-tiny``; its refill rounds are off here, so that every arm plays the same 80 rollouts a
  step; ``--set`` applies to every arm, so turning them back on there refills Search-R1's
  zero-variance filter too);
* ``tiresrag_no_difficulty`` (with ``--ablation``): the same without W (the paper's "w/o Difficulty");
* ``tiresrag_no_reflection`` (with ``--arms``): no reflection pass and no R^R;

1. a short SFT warm start on the arm's own oracle (``--sft-steps``; TIRESRAG's oracle also writes the
   reflection pass), so the policy starts mostly wrong;
2. GRPO with identical budgets for every arm (``COMMON``: G = 5, 16 questions a step and no refill,
   the same token and turn limits, optimiser, sampling temperature and steps; the protocol, the
   reward, the advantage and the filter are the method's);
3. greedy evaluation of the warm start and of the trained policy on the held-out questions.

Reported per arm: held-out EM and F1 (all, and EM on the answerable questions), the most common
answer's share (the collapse check), searches per question, answers per episode and the reflection's
transitions (TIRESRAG), and from training the rollouts played per step, the share of episodes that
reached the update, the saturated-group shares, W, the penalty and each reward component's mean.

    python benchmarks/tiresrag_vs_search_r1.py --seeds 0 1 2 [--sft-steps 200] [--steps 40] [--ablation]

The defaults are the demo's (200 SFT steps, 40 GRPO steps).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tiny_setup import add_comparison_args, compare_arm, print_results, resolve_base, run_comparison

ARMS = {
    "search_r1": ("search_r1-tiny", []),
    "tiresrag": ("tiresrag-tiny", []),
    "tiresrag_no_difficulty": ("tiresrag-tiny", ["train.grpo.advantage_params.difficulty=false"]),
    "tiresrag_no_reflection": ("tiresrag-tiny", ["protocol.reflect=false", "reward.3.weight=0.0"]),
}
COMMON = [
    "rollout.n=5", "rollout.max_turns=5", "rollout.max_total_tokens=384", "rollout.max_new_tokens=48",
    "rollout.max_obs_tokens=160", "rollout.k=2", "rollout.temperature=0.5",
    "train.grpo.prompts_per_step=16", "train.grpo.refill_rounds=0", "train.grpo.micro_batch_size=80",
    "train.grpo.kl_coef=0.0",
    "train.optim.lr=2e-4", "train.optim.warmup_steps=5", "train.sft.batch_size=16", "train.sft.lr=1e-3",
    "train.eval_every=0", "train.samples_every=0",
]  # fmt: skip
COLUMNS = ("em", "f1", "em_answerable", "top_answer_share", "unknown_rate", "searches_per_question",
           "answer_rate", "answers", "reflect/none", "reflect/wrong_to_right", "reflect/right_to_wrong",
           "reflect/unchanged")  # fmt: skip
TRAINING = ("samples", "refill_rounds", "kept_frac", "filter/low_frac", "filter/high_frac", "adv/W_mean",
            "adv/penalty_share", "reward/tiresrag_answer", "reward/tiresrag_sufficiency",
            "reward/tiresrag_thinking", "reward/tiresrag_reflection")  # fmt: skip


def run(workdir: Path, seed: int, arm: str, args: argparse.Namespace) -> dict:
    config, overrides = ARMS[arm]
    return compare_arm(
        workdir, seed, arm, config, [*COMMON, *overrides], sft_steps=args.sft_steps, extra=args.overrides,
        steps=args.steps, copy_steps=args.copy_steps, columns=COLUMNS, training=TRAINING,
        base=resolve_base(args.base),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_comparison_args(ap, sft_steps=200, steps=40)
    ap.add_argument("--ablation", action="store_true", help="also run TIRESRAG-R1 without W")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=None, help="the arms to run (default: "
                    "search_r1 and tiresrag, plus tiresrag_no_difficulty with --ablation)")  # fmt: skip
    args = ap.parse_args()
    arms = args.arms or ["search_r1", "tiresrag", *(["tiresrag_no_difficulty"] if args.ablation else [])]
    results = run_comparison(args, arms, "ragrl-tiresrag-vs-search-r1-", run)
    print_results(results, COLUMNS, TRAINING)
    print("\nheld-out after GRPO (mean over seeds " + " ".join(map(str, args.seeds)) + "):")
    for arm in arms:
        rows = [r for r in results if r["arm"] == arm]

        def avg(key: str, phase: str = "after", rows: list = rows) -> float:
            return statistics.mean(r[phase][key] for r in rows)

        print(
            f"  {arm:<24} EM {avg('em'):.3f}  F1 {avg('f1'):.3f}  answerable EM "
            f"{avg('em_answerable', 'before'):.3f} -> {avg('em_answerable'):.3f}"
            f"  top-answer share {avg('top_answer_share'):.2f}"
            f"  searches/q {avg('searches_per_question'):.2f}"
        )


if __name__ == "__main__":
    main()
