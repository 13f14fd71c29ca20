"""Eval-RAR vs Search-R1 on the CPU, from a deliberately weak warm start (Eval-RAR spec §7.2 item 3).

For each seed: the synthetic world (seed-specific, the default ``facts`` split), its BM25 index and one
tiny policy with the demo's copy pre-training (``--copy-steps``); then for each arm

* ``search_r1``: Search-R1's prompt and the outcome reward (EM) only;
* ``eval_rar``: the evaluate step and the gated reward (1 / 0.1 / 0);
* ``eval_rar_no_eval`` (with ``--ablation``): the evaluate step, EM only (the paper's Table 2 ablation);
* ``eval_rar_code`` (with ``--arms``): the evaluation tier only for trajectories that answered
  (AutoRefine's code, ``reward.1.if_no_answer=code``);
* ``eval_rar_guarded`` (with ``--arms``): that, plus word containment and only the evaluations that
  open the text right after an observation (``after_observation_only``, our guard against gaming);

1. a short SFT warm start on the arm's own oracle (``--sft-steps``; the Eval-RAR oracle also writes an
   evaluation after every observation), so the policy starts mostly wrong;
2. GRPO with identical budgets for every arm (``COMMON``: G = 5, the same token limits, optimiser, KL
   and steps; only the protocol and the reward differ);
3. greedy evaluation of the warm start and of the trained policy on the held-out questions.

Reported per arm: held-out EM (all, and on the answerable questions), the most common answer's share
(the collapse check), searches and executed searches per question, answer rate, the
evaluate-contains-gold rate, and from training the mean share of zero-variance groups (groups that give
no gradient) and the mean number of searches per rollout over the first and the last 10 steps.

The last line is the headline: held-out EM after GRPO and searches per question, Eval-RAR vs Search-R1,
averaged over the seeds.

    python benchmarks/eval_rar_vs_search_r1.py --seeds 0 1 [--sft-steps 100] [--steps 30] [--ablation]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tiny_setup import add_comparison_args, compare_arm, print_results, resolve_base, run_comparison

ARMS = {
    "search_r1": ("search_r1-tiny", []),
    "eval_rar": ("eval_rar-tiny", []),
    "eval_rar_no_eval": ("eval_rar-tiny", ["reward.1.weight=0.0"]),
    "eval_rar_code": ("eval_rar-tiny", ["reward.1.if_no_answer=code"]),
    "eval_rar_guarded": (
        "eval_rar-tiny",
        ["reward.1.if_no_answer=code", "reward.1.containment=word", "reward.1.after_observation_only=true"],
    ),
}
COMMON = [
    "rollout.n=5", "rollout.max_turns=4", "rollout.max_total_tokens=384", "rollout.max_new_tokens=64",
    "rollout.max_obs_tokens=160", "rollout.k=2", "rollout.temperature=0.5",
    "train.grpo.prompts_per_step=16", "train.grpo.micro_batch_size=80", "train.grpo.kl=low_var_kl",
    "train.grpo.kl_coef=0.001", "train.grpo.advantage_params.std=sample",
    "train.grpo.advantage_params.eps=1e-6",
    "train.grpo.group_filter=drop_zero_variance", "train.optim.lr=2e-4", "train.optim.warmup_steps=5",
    "train.sft.batch_size=16", "train.sft.lr=1e-3", "train.eval_every=0", "train.samples_every=0",
]  # fmt: skip
COLUMNS = ("em", "em_answerable", "top_answer_share", "unknown_rate", "searches_per_question",
           "valid_searches", "answer_rate", "evaluate_contains_gold")  # fmt: skip


def run(workdir: Path, seed: int, arm: str, args: argparse.Namespace) -> dict:
    config, overrides = ARMS[arm]
    return compare_arm(
        workdir, seed, arm, config, [*COMMON, *overrides], sft_steps=args.sft_steps, extra=args.overrides,
        steps=args.steps, copy_steps=args.copy_steps, columns=COLUMNS, base=resolve_base(args.base),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_comparison_args(ap, sft_steps=100, steps=30)
    ap.add_argument("--ablation", action="store_true", help="also run Eval-RAR without the evaluation reward")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=None, help="the arms to run (default: "
                    "search_r1 and eval_rar, plus eval_rar_no_eval with --ablation)")  # fmt: skip
    args = ap.parse_args()
    arms = args.arms or ["search_r1", "eval_rar", *(["eval_rar_no_eval"] if args.ablation else [])]
    results = run_comparison(args, arms, "ragrl-eval-rar-vs-search-r1-", run)
    print_results(results, COLUMNS, ("zero_variance_frac", "searches_first10", "searches_last10"))

    def avg(arm: str, key: str) -> float:
        return statistics.mean(r["after"][key] for r in results if r["arm"] == arm)

    if not {"search_r1", "eval_rar"} <= set(arms):
        return
    em_gap = 100 * (avg("eval_rar", "em") - avg("search_r1", "em"))
    print(
        f"held-out after GRPO over seeds {args.seeds}: EM Eval-RAR {avg('eval_rar', 'em'):.3f} vs Search-R1 "
        f"{avg('search_r1', 'em'):.3f} ({em_gap:+.1f} points); "
        f"searches/question {avg('eval_rar', 'searches_per_question'):.2f} vs "
        f"{avg('search_r1', 'searches_per_question'):.2f}"
    )


if __name__ == "__main__":
    main()
