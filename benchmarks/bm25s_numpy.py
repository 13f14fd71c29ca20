"""Raw bm25s under two numpy versions: the raw half of ``retrieval_throughput.py`` (``bm25s.tokenize`` +
``BM25.retrieve``, the 6,119-passage HippoRAG 2Wiki corpus, 1,000 2Wiki dev questions, k = 10) run by
this interpreter and by ``--other`` (a virtualenv with another numpy), alternately, each best of N.

    python3 -m venv /tmp/np126
    /tmp/np126/bin/pip install numpy==1.26.4 bm25s==0.3.16 PyStemmer==3.1.0
    .venv/bin/python benchmarks/bm25s_numpy.py --other /tmp/np126/bin/python [--rounds 2]

Needs only bm25s, numpy and PyStemmer (not ragrl), so any virtualenv with those runs it. Both sides must
return the same top-k scores, query by query, within 1e-4, and the same passages above the last place
(checked; which equal-score passages fill the last places may differ). The last line printed is the
ratio of ``--other``'s throughput to this interpreter's (best round each); each round prints the
versions it ran with (the bm25s versions must be the same). ``RAGRL_SHARED_DATA`` points it at another
copy of the data folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RAGRL_SHARED_DATA", ROOT.parent / "shared" / "data"))
CORPUS = DATA / "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json"
QUESTIONS = DATA / "2wikimultihopqa/peterbaile__lag/dev.json"


def raw_bm25s(texts: list[str], questions: list[str], k: int, n_threads: int = 0) -> Callable[[], Any]:
    """bm25s's documented usage over ``texts`` (``bm25s.tokenize`` + ``BM25.retrieve``: lower-case, English
    stopwords, Snowball stemming; lucene, k1 1.5, b 0.75), indexed now: a function that searches
    ``questions``, tokenization included, and returns bm25s's ``(docs, scores)``."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    model = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    model.index(
        bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False
    )

    def run():  # noqa: ANN202
        tokens = bm25s.tokenize(questions, stopwords="en", stemmer=stemmer, show_progress=False)
        return model.retrieve(tokens, k=k, show_progress=False, n_threads=n_threads)

    return run


def measure(queries: int, repeats: int) -> dict[str, object]:
    """This interpreter's raw bm25s: its versions, queries a second (best of ``repeats``) and every
    query's hits as ``[passage, score]`` pairs."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import bm25s
    import numpy as np

    texts = [f"{p['title']}\n{p['text']}" for p in json.loads(CORPUS.read_text())]
    questions = [q["question"] for q in json.loads(QUESTIONS.read_text())][:queries]
    run = raw_bm25s(texts, questions, k=10)
    docs, scores = run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    versions = {"python": platform.python_version(), "numpy": np.__version__, "bm25s": bm25s.__version__}
    for name in ("scipy", "PyStemmer"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "none"
    hits = [list(zip(d, s, strict=True)) for d, s in zip(docs.tolist(), scores.tolist(), strict=True)]
    return {**versions, "qps": len(questions) / min(times), "hits": hits}


def compare(this: list[list[list[float]]], other: list[list[list[float]]]) -> tuple[float, int]:
    """The largest score difference between the two runs' hits, query by query, and the number of queries
    whose passages differ (only ever where scores tie, or nearly: checked). Exits when they disagree."""
    gap, ties = 0.0, 0
    for i, (a, b) in enumerate(zip(this, other, strict=True)):
        scores_a, scores_b = sorted(s for _, s in a), sorted(s for _, s in b)
        gap = max([gap, *(abs(x - y) for x, y in zip(scores_a, scores_b, strict=True))])
        kth = scores_a[0] + 1e-4  # passages scoring clearly above the last place are the same
        if {d for d, s in a if s > kth} != {d for d, s in b if s > kth}:
            sys.exit(f"query {i}: the two runs return other passages above the last place")
        ties += sorted(d for d, _ in a) != sorted(d for d, _ in b)
    if gap > 1e-4:
        sys.exit(f"the two runs' scores differ by up to {gap:.2e}")
    if sum(max(s for _, s in a) > 0 for a in this) < len(this) / 2:
        sys.exit("most queries found nothing: the comparison would say nothing")
    return gap, ties


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", help="the other virtualenv's python (its numpy is the comparison)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two interpreters")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one measurement, as JSON
    args = ap.parse_args()
    if args.queries < 1 or args.repeats < 1 or args.rounds < 1:
        ap.error("--queries, --repeats and --rounds must be at least 1")
    if args.once:
        print(json.dumps(measure(args.queries, args.repeats)))
        return
    if not args.other:
        ap.error("--other PYTHON is required (a virtualenv with another numpy; see the docstring)")
    pythons = {"this": sys.executable, "other": args.other}
    best: dict[str, dict[str, Any]] = {}
    for round_ in range(1, args.rounds + 1):
        for name, python in pythons.items():
            command = [python, __file__, "--once", "--queries", str(args.queries)]
            command += ["--repeats", str(args.repeats)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                sys.exit(f"{python}: failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.splitlines()[-1])
            versions = ", ".join(f"{k} {row[k]}" for k in ("python", "bm25s", "scipy", "PyStemmer"))
            print(
                f"round {round_}: numpy {row['numpy']} ({versions}): {row['qps']:8,.0f} queries/s", flush=True
            )
            if name not in best or row["qps"] > best[name]["qps"]:
                best[name] = row
    this, other = best["this"], best["other"]
    if this["bm25s"] != other["bm25s"]:
        sys.exit(f"bm25s {this['bm25s']} here, {other['bm25s']} there: the ratio would not be numpy's alone")
    # float32 sums may round differently across numpy versions (a unit in the last place)
    gap, ties = compare(this["hits"], other["hits"])
    print(
        f"the same scores for all {len(this['hits'])} queries (within {gap:.1e}); {ties} differ in which "
        "equal or nearly equal-score passages fill the last places"
    )
    ratio = other["qps"] / this["qps"]
    print(f"numpy {other['numpy']} / numpy {this['numpy']} throughput ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
