"""Why an arm of a method comparison did (not) gain: its warm start's and final policy's outcomes.

Replays the saved policies of one arm of ``eval_rar_vs_search_r1.py`` or ``tiresrag_vs_search_r1.py``
(run with ``--workdir``) on the seed's held-out test questions, greedy, with the arm's own settings
(the benchmark's ``COMMON``, the arm's overrides and, with ``--base``, ``tiny_setup.base_overrides``),
and prints EM and the outcome counts of the answerable questions (right, read miss
``wrong_with_all_evidence``, search miss ``wrong_missing_evidence``, no answer; docs/eval.md).

    python benchmarks/arm_outcomes.py tiresrag_vs_search_r1 runs/bench/tr 2 tiresrag --base
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
from ragrl.retrieval.base import load_retriever  # noqa: E402
from ragrl.rollout.outcomes import count_outcomes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("benchmark", choices=["eval_rar_vs_search_r1", "tiresrag_vs_search_r1"])
    ap.add_argument("workdir", type=Path, help="the comparison's --workdir")
    ap.add_argument("seed", type=int)
    ap.add_argument("arm")
    ap.add_argument("--base", action="store_true", help="the comparison ran with --base")
    args = ap.parse_args()
    bench = importlib.import_module(args.benchmark)
    config, extra = bench.ARMS[args.arm]
    overrides = [*bench.COMMON, *extra]
    method = load_method(config, [*overrides, *(base_overrides(config, overrides) if args.base else [])])
    data = args.workdir / f"world-{args.seed}"
    test = method.prepare_examples(read_examples(data / "test.jsonl")[0], "test")
    retriever = load_retriever(data / "bm25")
    answerable = {e.id for e in test if e.answerable}
    run = args.workdir / f"{args.arm}-{args.seed}"
    warm = sorted((run / "warm_start" / "checkpoints").glob("step-*"))[-1] / "policy"
    for name, path in (("warm start", warm), ("after GRPO", run / "policy")):
        backend = TransformersBackend(path, device="cpu", dtype="float32", batch_size=128)
        report = evaluate(backend, retriever, method, test)
        counts = count_outcomes([r["outcome"] for r in report.rows if r["id"] in answerable])
        print(json.dumps({"arm": args.arm, "seed": args.seed, "policy": name, "em": report.scores["em"],
                          "outcomes_answerable": counts}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
