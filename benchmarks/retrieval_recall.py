"""Supporting-passage recall of BM25, dense and hybrid retrieval on real multi-hop data.

Builds one closed corpus from the given contexts of the shared HotpotQA, 2WikiMultiHopQA and MuSiQue
samples (the union, deduplicated by passage id), indexes it with each retriever and reports, per
dataset, recall@2/5/10 of the supporting passages, full recall@k (all supporting passages found), MRR
and answer-string recall@5. The dense retriever is there three times, over the same MiniLM vectors
(encoded once: the later builds keep the first one's shards): the exact ``flat`` index and the
approximate ``hnsw`` and ``ivf-pq`` ones at their default settings; a second table gives each one's
recall@10 against exact search on the questions and its queries/s at batch 32 (the index search
alone, the questions encoded once), with the IVF-PQ index also at other nprobe / rerank settings.
Prints markdown tables; the last line is the hybrid ÷ BM25 recall@5 ratio averaged over the datasets.

    python benchmarks/retrieval_recall.py [--shared ../shared/data] [--workdir runs/retrieval_recall]

Index directories under --workdir are reused when present (the dense index of ~11k passages takes
several minutes to encode on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ragrl.data import load_dataset
from ragrl.retrieval import load_retriever
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.retrieval.dense import DenseRetriever
from ragrl.retrieval.evaluate import evaluate_retriever
from ragrl.retrieval.hybrid import HybridRetriever

DATASETS = {
    "HotpotQA": "hotpotqa/leeyeezeee__benchfortir/test.jsonl",
    "2Wiki": "2wikimultihopqa/saptarshi059__TTS-project/sampled_ds.json",
    "MuSiQue": "musique/AdelWang__MIGRES/musique.json",
}
KS = (2, 5, 10)


def main() -> None:
    here = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", type=Path, default=here.parent / "shared" / "data")
    parser.add_argument("--workdir", type=Path, default=here / "runs" / "retrieval_recall")
    args = parser.parse_args()

    questions = {}
    corpus = {}
    for name, rel in DATASETS.items():
        examples, _ = load_dataset(args.shared / rel)
        questions[name] = [ex for ex in examples if ex.supporting_ids]
        for ex in examples:
            for p in ex.passages or []:
                corpus.setdefault(p.id, p)
    passages = list(corpus.values())
    print(
        f"corpus: {len(passages):,} passages from the given contexts of "
        + ", ".join(f"{n} ({len(q)} questions)" for n, q in questions.items())
    )

    def cached(name, build):
        path = args.workdir / name
        if (path / "retriever.json").exists():
            return load_retriever(path)
        t0 = time.perf_counter()
        retriever = build()
        retriever.save(path)
        print(f"built {name} index in {time.perf_counter() - t0:.0f} s")
        return retriever

    shards = args.workdir / "dense-shards"  # the MiniLM vectors, encoded once for the three dense indexes
    bm25 = cached("bm25", lambda: BM25Retriever.build(passages))
    dense = cached("dense", lambda: DenseRetriever.build(passages, workdir=shards))
    approximate = {
        kind: cached(
            f"dense-{kind}", lambda kind=kind: DenseRetriever.build(passages, index_type=kind, workdir=shards)
        )
        for kind in ("hnsw", "ivf-pq")
    }
    retrievers = {
        "BM25": bm25,
        "dense (MiniLM-L6)": dense,
        **{f"dense {kind} ({r.spec})": r for kind, r in approximate.items()},
        "hybrid (RRF)": HybridRetriever(bm25, dense),
    }

    header = ["dataset", "retriever", *[f"R@{k}" for k in KS], *[f"full R@{k}" for k in KS], "MRR", "ans R@5"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ratios = []
    for ds, examples in questions.items():
        results = {name: evaluate_retriever(r, examples, ks=KS) for name, r in retrievers.items()}
        for name, m in results.items():
            cells = [
                ds,
                name,
                *[f"{m[f'recall@{k}']:.3f}" for k in KS],
                *[f"{m[f'full_recall@{k}']:.3f}" for k in KS],
                f"{m['mrr']:.3f}",
                f"{m['answer_recall@5']:.3f}",
            ]
            print("| " + " | ".join(cells) + " |")
        ratios.append(results["hybrid (RRF)"]["recall@5"] / results["BM25"]["recall@5"])
    # the IVF-PQ index at other search settings, for the cost of each (the defaults: nprobe 512, rerank 10)
    settings = ((16, 10), (64, 10), (128, 5), (256, 20))
    variants = [load_retriever(args.workdir / "dense-ivf-pq", nprobe=n, rerank=r) for n, r in settings]
    approximate_table(
        [dense, *approximate.values(), *variants], [ex.question for q in questions.values() for ex in q]
    )
    print(f"hybrid/bm25 recall@5 ratio (mean over datasets): {sum(ratios) / len(ratios):.3f}")


def approximate_table(indexes: list[DenseRetriever], queries: list[str], batch: int = 32) -> None:
    """Recall@10 against exact search and queries/s at ``batch`` of each dense index, same queries."""
    emb = indexes[0].encode_queries(queries)
    print(
        f"\n| dense index ({len(queries)} questions) | recall@1 / @10 vs exact | queries/s at batch {batch} |"
    )
    print("|---|---|---|")
    for r in indexes:
        r.search_vectors(emb[:batch], 10)  # warm-up
        t0 = time.perf_counter()
        for start in range(0, len(queries), batch):
            r.search_vectors(emb[start : start + batch], 10)
        qps = len(queries) / (time.perf_counter() - t0)
        recall = r.recall(queries)
        print(
            f"| {r.spec} {r.search_params or ''} | {recall['recall@1']:.3f} / {recall['recall@10']:.3f} | "
            f"{qps:,.0f} |"
        )


if __name__ == "__main__":
    main()
