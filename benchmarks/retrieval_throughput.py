"""BM25 throughput: ragrl's BM25Retriever vs raw bm25s vs rank_bm25, same corpus, queries and tokens.

    .venv/bin/python benchmarks/retrieval_throughput.py [--queries 1000] [--k 10] [--repeats 5]

All three use the same tokens (bm25s tokenizer: lower-case, English stopwords, Snowball stemming).
ragrl and raw bm25s (its documented usage: ``bm25s.tokenize`` + ``BM25.retrieve``) are timed end
to end (query strings in, top-k out: tokenization included),
interleaved, after a warm-up, best of N. rank_bm25 scores every document in Python per query, so it
runs on a subset (``--rank-bm25-queries``) and is compared per query. The ratios come last, in this
order: ragrl / raw bm25s throughput; with ``--compare-threads N``, ragrl's throughput with
``n_threads=N`` over ``--n-threads``'s, both timed interleaved on the same index; with ``--loaded``,
an index saved and loaded back (``BM25Retriever.load``: its passages read from its corpus file on
demand) over the built one (its passages in memory; both map the same score files, which the save
links), same queries, interleaved, same hits checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s_numpy import raw_bm25s  # benchmarks/: the raw half that script runs under two numpys

from ragrl.data.io import read_corpus
from ragrl.retrieval.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RAGRL_SHARED_DATA", ROOT.parent / "shared" / "data"))
CORPUS = DATA / "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json"
QUESTIONS = DATA / "2wikimultihopqa/peterbaile__lag/dev.json"


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rank-bm25-queries", type=int, default=50)
    ap.add_argument("--n-threads", type=int, default=0, help="bm25s threads (same for ragrl and bm25s)")
    ap.add_argument(
        "--compare-threads", type=int, default=0, metavar="N",
        help="also time ragrl's BM25 with n_threads=N against --n-threads, interleaved (its ratio printed)",
    )  # fmt: skip
    ap.add_argument(
        "--loaded", action="store_true",
        help="also time the index saved and loaded back (mapped) against the built one (ratio printed last)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.compare_threads and max(args.compare_threads, 1) == max(args.n_threads, 1):
        # ragrl's BM25 runs in the calling thread for n_threads 0 and 1 alike
        ap.error(f"--compare-threads {args.compare_threads} runs as --n-threads {args.n_threads} does")

    passages, _ = read_corpus(CORPUS)
    questions = [q["question"] for q in json.loads(QUESTIONS.read_text())][: args.queries]
    k = args.k
    print(
        f"corpus: {len(passages):,} passages ({CORPUS.name}); queries: {len(questions):,}; k={k}; "
        f"cpus: {os.cpu_count()}; bm25s {bm25s.__version__}; numpy {np.__version__}"
    )

    # ragrl
    ragrl = BM25Retriever.build(passages, n_threads=args.n_threads)

    # raw bm25s with the same settings, indexed from the same texts
    stemmer = Stemmer.Stemmer("english")  # rank_bm25's tokens, below
    texts = [p.contents for p in passages]
    run_raw = raw_bm25s(texts, questions, k, args.n_threads)

    def run_ragrl():
        return ragrl.search(questions, k)

    # same results: ragrl returns bm25s's positive-score hits with identical scores; passages with
    # equal scores may come in another order (ragrl: corpus order) and, at the k-th place, be others
    docs, scores = run_raw()
    ours = run_ragrl()
    id_of = {id(p): i for i, p in enumerate(ragrl.passages)}
    n_tie_diff = 0
    for row_d, row_s, hits in zip(docs.tolist(), scores.tolist(), ours, strict=True):
        raw_hits = [(d, s) for d, s in zip(row_d, row_s, strict=True) if s > 0]
        our_hits = [(id_of[id(h.passage)], h.score) for h in hits]
        assert [s for _, s in raw_hits] == [s for _, s in our_hits], "ragrl and bm25s scores differ"
        if our_hits:
            last = our_hits[-1][1]
            assert {h for h in raw_hits if h[1] > last} == {h for h in our_hits if h[1] > last}
            n_tie_diff += raw_hits != our_hits
    print(
        f"check: identical scores and hits for all {len(questions)} queries "
        f"({n_tie_diff} differ only in the order or choice of equal-score passages)"
    )

    # warm-up, then interleaved best-of-N
    run_raw(), run_ragrl()
    t_raw, t_ragrl = [], []
    for _ in range(args.repeats):
        t_raw.append(best_of(run_raw, 1))
        t_ragrl.append(best_of(run_ragrl, 1))
    qps_raw = len(questions) / min(t_raw)
    qps_ragrl = len(questions) / min(t_ragrl)

    # rank_bm25 on a subset, same tokens
    try:
        from rank_bm25 import BM25Okapi
    except ImportError:
        BM25Okapi = None
    qps_rank = None
    if BM25Okapi is not None:
        corpus_tokens = bm25s.tokenize(
            texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
        )
        okapi = BM25Okapi(corpus_tokens, k1=1.5, b=0.75)
        sub = questions[: args.rank_bm25_queries]

        def run_rank():
            q_tokens = bm25s.tokenize(
                sub, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
            )
            return [np.argsort(-okapi.get_scores(q))[:k] for q in q_tokens]

        run_rank()
        qps_rank = len(sub) / best_of(run_rank, max(2, args.repeats // 3))

    print(f"raw bm25s:  {qps_raw:10,.0f} queries/s  (best of {args.repeats}, {len(questions)} queries)")
    print(f"ragrl bm25: {qps_ragrl:10,.0f} queries/s  (best of {args.repeats}, {len(questions)} queries)")
    if qps_rank is not None:
        print(f"rank_bm25:  {qps_rank:10,.1f} queries/s  (BM25Okapi, {args.rank_bm25_queries} queries)")
        print(f"ragrl/rank_bm25 throughput ratio: {qps_ragrl / qps_rank:.1f}")
    else:
        print("rank_bm25 not installed (pip install 'ragrl[bench]'); skipped")
    sys.stdout.flush()
    print(f"ragrl/bm25s throughput ratio: {qps_ragrl / qps_raw:.2f}")
    if args.compare_threads:  # the same index and queries, only the retriever's n_threads differs
        base, threads = args.n_threads, args.compare_threads
        times: dict[int, list[float]] = {base: [], threads: []}
        for _ in range(args.repeats):
            for n in (base, threads):
                ragrl.n_threads = n
                times[n].append(best_of(run_ragrl, 1))
        qps = {n: len(questions) / min(t) for n, t in times.items()}
        print(f"ragrl bm25, n_threads={base}: {qps[base]:10,.0f} queries/s")
        print(f"ragrl bm25, n_threads={threads}: {qps[threads]:10,.0f} queries/s")
        print(f"n_threads={threads} / n_threads={base} throughput ratio: {qps[threads] / qps[base]:.2f}")
        ragrl.n_threads = base
    if args.loaded:
        time_loaded(ragrl, questions, k, args.repeats)


def time_loaded(built: BM25Retriever, questions: list[str], k: int, repeats: int) -> None:
    """The built index against itself saved and loaded back (its score arrays mapped from the files,
    the page cache warm after the warm-up), interleaved best of ``repeats``; same hits checked."""
    with tempfile.TemporaryDirectory(prefix="ragrl-bm25-") as tmp:
        built.save(tmp)
        loaded = BM25Retriever.load(tmp, n_threads=built.n_threads)
        hits = [[(h.passage.id, h.score) for h in row] for row in built.search(questions, k)]
        if hits != [[(h.passage.id, h.score) for h in row] for row in loaded.search(questions, k)]:
            sys.exit("the loaded index's hits differ from the built one's")
        times: dict[str, list[float]] = {"built": [], "loaded": []}
        runs = [("built", built), ("loaded", loaded)]
        for i in range(repeats):  # each goes first every other time
            for name, retriever in runs[:: 1 if i % 2 == 0 else -1]:
                times[name].append(best_of(lambda r=retriever: r.search(questions, k), 1))
        # the directory goes while `loaded` still maps its files: on Linux the mappings stay readable
    qps = {name: len(questions) / min(t) for name, t in times.items()}
    n_hits = sum(len(row) for row in hits)  # a loaded index reads each hit's passage from its file
    extra = (min(times["loaded"]) - min(times["built"])) / max(n_hits, 1)
    print(f"ragrl bm25, built (passages in memory): {qps['built']:10,.0f} queries/s")
    print(f"ragrl bm25, loaded (passages on disk):  {qps['loaded']:10,.0f} queries/s  (same hits)")
    print(f"loaded: {extra * 1e6:.1f} us more for each of the {n_hits:,} hits (its passage read on demand)")
    print(f"loaded / built throughput ratio: {qps['loaded'] / qps['built']:.2f}")


if __name__ == "__main__":
    main()
