"""Why an arm of a method comparison did (not) gain: its warm start's and final policy's outcomes.

Replays the saved policies of one arm of ``eval_rar_vs_search_r1.py``, ``tiresrag_vs_search_r1.py``,
``r2ag_vs_warm_start.py`` or ``arena_vs_naive.py`` (run with ``--workdir``) on the seed's held-out test
questions, greedy, with the arm's own settings (the benchmark's ``COMMON``, the arm's overrides and,
with ``--base``, ``ragrl.train.from_base.base_overrides``), and prints EM and the outcome counts of the
answerable questions (right, read miss ``wrong_with_all_evidence``, search miss
``wrong_missing_evidence``, no answer; docs/eval.md).
For R²AG, whose trees retrieve and do not answer, the counts are of the trees instead: every gold passage
found, some, none; and question by question, how many trees the final policy made better or worse.
For ARENA, which reads given passages (every wrong answer is a reading miss), the wrong answers are also
split by what the reply cited: every gold passage, some, none.

    python benchmarks/arm_outcomes.py tiresrag_vs_search_r1 runs/bench/tr 2 tiresrag --base
    python benchmarks/arm_outcomes.py r2ag_vs_warm_start runs/bench/r2 0 r2ag --base
    python benchmarks/arm_outcomes.py arena_vs_naive runs/bench/arena 0 arena --base
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_setup import base_overrides  # noqa: E402

from ragrl.data.io import read_examples  # noqa: E402
from ragrl.eval.runner import evaluate  # noqa: E402
from ragrl.llm.hf_backend import TransformersBackend  # noqa: E402
from ragrl.methods import load_method  # noqa: E402
from ragrl.methods.r2ag.tree import tree_diagnostics  # noqa: E402
from ragrl.retrieval.base import load_retriever  # noqa: E402
from ragrl.rollout.outcomes import count_outcomes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "benchmark",
        choices=["eval_rar_vs_search_r1", "tiresrag_vs_search_r1", "r2ag_vs_warm_start", "arena_vs_naive"],
    )
    ap.add_argument("workdir", type=Path, help="the comparison's --workdir")
    ap.add_argument("seed", type=int)
    ap.add_argument("arm")
    ap.add_argument("--base", action="store_true", help="the comparison ran with --base")
    args = ap.parse_args()
    bench = importlib.import_module(args.benchmark)
    if args.benchmark == "r2ag_vs_warm_start":
        config, overrides = "r2ag-tiny", list(bench.ARMS[args.arm])
    elif args.benchmark == "arena_vs_naive":
        config, overrides = bench.METHODS[args.arm], []
    else:
        config, extra = bench.ARMS[args.arm]
        overrides = [*bench.COMMON, *extra]
    method = load_method(config, [*overrides, *(base_overrides(config, overrides) if args.base else [])])
    data = args.workdir / f"world-{args.seed}"
    test = method.prepare_examples(read_examples(data / "test.jsonl")[0], "test")
    retriever = load_retriever(data / "bm25") if method.protocol.needs_retriever else None
    answerable = {e.id for e in test if e.answerable}
    run = args.workdir / f"{args.arm}-{args.seed}"
    warm = sorted((run / "warm_start" / "checkpoints").glob("step-*"))[-1] / "policy"
    recalls = {}
    for name, path in (("warm start", warm), ("after GRPO", run / "policy")):
        backend = TransformersBackend(path, device="cpu", dtype="float32", batch_size=128)
        report = evaluate(backend, retriever, method, test, variant=getattr(bench, "VARIANT", "squad"))
        if args.benchmark == "r2ag_vs_warm_start":
            by_id = {e.id: e for e in test}
            recall = {t.example_id: tree_diagnostics(t, by_id[t.example_id]).get("tree_recall", 0.0)
                      for t in report.trajectories}  # fmt: skip
            recalls[name] = recall
            trees = {"all gold found": sum(r == 1.0 for r in recall.values()),
                     "some": sum(0.0 < r < 1.0 for r in recall.values()),
                     "none": sum(r == 0.0 for r in recall.values())}  # fmt: skip
            print(json.dumps({"arm": args.arm, "seed": args.seed, "policy": name,
                              "tree_recall": round(sum(recall.values()) / len(recall), 3), "trees": trees}),
                  flush=True)  # fmt: skip
            continue
        counts = count_outcomes([r["outcome"] for r in report.rows if r["id"] in answerable])
        row = {"arm": args.arm, "seed": args.seed, "policy": name, "em": report.scores["em"],
               "outcomes_answerable": counts}  # fmt: skip
        if config == "arena-tiny":  # given passages: every miss is a reading miss; did it cite the gold?
            row["wrong_answers_by_citation"] = citation_of_misses(report, test)
        print(json.dumps(row), flush=True)
    if recalls:
        before, after = recalls["warm start"], recalls["after GRPO"]
        moved = {"trees_better": sum(after[q] > before[q] for q in before),
                 "trees_worse": sum(after[q] < before[q] for q in before),
                 "trees_same": sum(after[q] == before[q] for q in before)}  # fmt: skip
        print(json.dumps({"arm": args.arm, "seed": args.seed, **moved}))


def citation_of_misses(report, examples) -> dict[str, int]:  # noqa: ANN001
    """ARENA's wrong answers by what the reply cited: every gold passage, some, none (or no list)."""
    from ragrl.methods.arena.evidence import gold_ids
    from ragrl.methods.arena.protocol import citation

    by_id = {e.id: e for e in examples}
    out = {"cited all gold": 0, "some gold": 0, "no gold": 0}
    for row, traj in zip(report.rows, report.trajectories, strict=True):
        if row["outcome"] != "wrong_no_search":  # a wrong answer without a search: given passages
            continue
        gold = {i for i in gold_ids(by_id[traj.example_id]) if i > 0}
        cited = set(citation(traj)["cited_ids"] or [])
        out["cited all gold" if gold <= cited else "some gold" if gold & cited else "no gold"] += 1
    return out


if __name__ == "__main__":
    main()
