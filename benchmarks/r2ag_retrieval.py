"""R²AG on the shared real samples: step-wise retrieval (the tree) against single-step retrieval (SR@N).

For each sample (HotpotQA, 2Wiki, MuSiQue from ``../shared/data``, converted and split as
``benchmarks/real_baselines.py`` does: ``--n`` evaluated questions, the rest a pool), one index over the
paragraphs given with all the sample's questions (HippoRAG's pooled setting; BM25, or ``--retriever
dense``: the default MiniLM encoder), and these rows, all through ``R2agRollout`` (the same tree, parse
and metrics):

* ``SR@N``: one query, the question itself, top-N (``single_step``);
* ``oracle``: the gold decomposition (MuSiQue) or the supporting titles (HotpotQA, 2Wiki), one hop a
  step, at top-1 / top-2 and Top-Survivor t = M/2 or t = M (M = 2 for HotpotQA, 4 otherwise);
* ``R²AG-p``: ``--model`` (a small instruct model, SmolLM2-135M here) prompted with three of the
  oracle's steps on pool questions (a first step, a later one, a stop), greedy, t = M/2, top-1; with
  and without its predicted queries (R²AG vs R²AG_base).

Each row reports Recall, FR (all gold found), @K (documents retrieved), mAP (retrieval order, AP / |g|),
η_re = (Recall / @K) / (Recall_oracle / @K_oracle) × 100 against the oracle at top-1, t = M, Iter.
(steering steps), LLM calls and seconds per question; with ``--model``, QA on top (the model answers
from the retrieved documents: EM / F1) for SR@5, the oracle and R²AG-p.

    make smollm2
    python benchmarks/r2ag_retrieval.py --model models/smollm2-135m-instruct --out runs/r2ag-real
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_baselines import prepare, ragrl  # noqa: E402

HOPS = {"hotpotqa": 2, "2wiki": 4, "musique": 4}
"""M: the most reasoning hops of each dataset (spec §2.3)."""


def index(sample_dir: Path, kind: str) -> Path:
    out = sample_dir / kind
    if not out.is_dir():
        ragrl(
            "index",
            str(sample_dir / "corpus.jsonl"),
            "--out",
            str(out),
            "--retriever",
            kind,
            log=sample_dir / f"{kind}.log",
        )
    return out


def run_row(name, backend, retriever, method, examples, overrides):  # noqa: ANN001, ANN201
    from ragrl.eval.runner import evaluate

    config = dataclasses.replace(method.eval_rollout, **overrides)
    method = dataclasses.replace(method, eval_rollout=config)
    t0 = time.perf_counter()
    report = evaluate(backend, retriever, method, examples, chunk=len(examples))
    seconds = time.perf_counter() - t0
    s = report.scores
    row = {
        "row": name,
        "recall": s["tree_recall"],
        "fr": s["tree_full_recall"],
        "at_k": s["docs"],
        "map": s["tree_map"],
        "iter": s["iterations"],
        "llm_calls": s["llm_calls"],
        "seconds_per_q": seconds / len(examples),
        "invalid_steps": s["invalid_steps"],
    }
    if config.read:
        row.update(em=s["em"], f1=s["f1"], cover_em=s.get("cover_em", 0.0))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/r2ag-real"))
    parser.add_argument("--samples", nargs="+", default=list(HOPS), choices=list(HOPS))
    parser.add_argument("--n", type=int, default=100, help="evaluated questions per sample")
    parser.add_argument(
        "--model-n", type=int, default=50, help="of which the model rows evaluate the first N"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retriever", choices=("bm25", "dense"), default="bm25")
    parser.add_argument(
        "--model", type=Path, default=None, help="the steering and reading model (R²AG-p, QA)"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--qa-only", action="store_true", help="only the reader rows over SR@5 and the oracle"
    )
    args = parser.parse_args()

    from ragrl.console import quiet_libraries
    from ragrl.llm.hf_backend import TransformersBackend

    quiet_libraries()
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    model = None
    if args.model:
        model = TransformersBackend(str(args.model), device="cpu", batch_size=args.batch_size)
    results = [row for sample in args.samples for row in measure(sample, args, model, data)]
    suffix = "-qa" if args.qa_only else ""
    (args.out / f"results-{args.retriever}{suffix}.json").write_text(json.dumps(results, indent=1) + "\n")
    table = [
        "| sample | row | n | Recall | FR | @K | mAP | η_re | Iter. | LLM calls | s/question | EM | F1 "
        "| cover-EM |",
        "|" + "---|" * 14,
    ]
    for r in results:
        qa = f"{r['em']:.3f} | {r['f1']:.3f} | {r['cover_em']:.3f}" if "em" in r else "- | - | -"
        table.append(
            f"| {r['sample']} | {r['row']} | {r['n']} | {100 * r['recall']:.1f} | {100 * r['fr']:.1f} | "
            f"{r['at_k']:.2f} | {100 * r['map']:.1f} | {r['eta_re']:.1f} | {r['iter']:.2f} | "
            f"{r['llm_calls']:.2f} | {r['seconds_per_q']:.2f} | {qa} |"
        )
    (args.out / f"table-{args.retriever}{suffix}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def measure(sample: str, args: argparse.Namespace, model, data: Path) -> list[dict]:  # noqa: ANN001
    """Every row of one sample (module docstring)."""
    from ragrl.data.io import read_examples
    from ragrl.methods import load_method
    from ragrl.methods.r2ag.steering import SingleStepSteering, SteererBackend, SteeringOracle, oracle_shots
    from ragrl.retrieval.base import load_retriever

    eval_file, pool_file = prepare(sample, data, args.n, args.seed)
    retriever = load_retriever(index(data / sample, args.retriever))
    examples, _ = read_examples(eval_file)
    pool, _ = read_examples(pool_file)
    m = HOPS[sample]
    method = load_method("r2ag", ["rollout.max_new_tokens=128", "rollout.reader_max_new_tokens=32"])
    tok = model.tokenizer if model else _byte_tokenizer(data / sample / "corpus.jsonl")
    rows: list[dict] = []

    def add(name: str, backend, overrides: dict, questions=examples, steering=method) -> None:  # noqa: ANN001
        row = run_row(name, backend, retriever, steering, questions, overrides)
        row.update(sample=sample, retriever=args.retriever, n=len(questions))
        rows.append(row)
        print(json.dumps(row), flush=True)

    oracle = SteererBackend(tok, SteeringOracle())
    add("oracle@top-1, t=M", oracle, {"k": 1, "top_t": m, "top_t_pred": m})
    if not args.qa_only:
        for n in (1, 2, 3, 5, 10, 20):
            add(f"SR@{n}", SteererBackend(tok, SingleStepSteering()), {"k": n, "top_t": None})
        add("oracle@top-1, t=M/2", oracle, {"k": 1, "top_t": m // 2, "top_t_pred": m // 2})
        add("oracle@top-2, t=M/2", oracle, {"k": 2, "top_t": m // 2, "top_t_pred": m // 2})
    if model is not None and not args.qa_only:
        few = examples[: args.model_n]
        shots = oracle_shots(method, model.tokenizer, pool[:30], retriever)
        prompted = dataclasses.replace(method, protocol=method.protocol.with_shots(shots))
        cut = {"k": 1, "top_t": m // 2, "top_t_pred": m // 2}
        add("R²AG-p@top-1, t=M/2 + reader", model, {**cut, "read": True}, few, prompted)
        add("R²AG_base-p@top-1, t=M/2", model, {**cut, "use_pred": False}, few, prompted)
    if model is not None:
        few = examples[: args.model_n]
        reader = SteererBackend(model.tokenizer, SingleStepSteering(), reader=model)
        add("SR@5 + reader", reader, {"k": 5, "top_t": None, "read": True}, few)
        reader = SteererBackend(model.tokenizer, SteeringOracle(), reader=model)
        add("oracle@top-1, t=M + reader", reader, {"k": 1, "top_t": m, "top_t_pred": m, "read": True}, few)
    ref = next(r for r in rows if r["row"] == "oracle@top-1, t=M")
    for r in rows:
        efficient = r["at_k"] and ref["recall"]
        r["eta_re"] = 100 * (r["recall"] / r["at_k"]) / (ref["recall"] / ref["at_k"]) if efficient else 0.0
    return rows


def _byte_tokenizer(corpus: Path):  # noqa: ANN202
    """A tokenizer for the scripted rows when no model is given (their text is only cut and encoded): a
    byte-level BPE trained on the sample's corpus and the method's wording, so nothing is unknown."""
    from ragrl.data.io import read_corpus
    from ragrl.llm.tiny import train_tokenizer
    from ragrl.methods import vocabulary_texts

    passages, _ = read_corpus(corpus)
    texts = [f"{p.title}\n{p.text}" for p in passages] + vocabulary_texts()
    return train_tokenizer(texts, kind="bpe", vocab_size=4096)


if __name__ == "__main__":
    main()
