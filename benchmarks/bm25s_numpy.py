"""Raw bm25s under two numpy versions: the raw half of ``retrieval_throughput.py`` (``bm25s.tokenize`` +
``BM25.retrieve``, the 6,119-passage HippoRAG 2Wiki corpus, 1,000 2Wiki dev questions, k = 10) run by
this interpreter and by ``--other`` (a virtualenv with another numpy), alternately, each best of N.

    python3 -m venv /tmp/np126
    /tmp/np126/bin/pip install numpy==1.26.4 bm25s==0.3.16 PyStemmer==3.1.0
    .venv/bin/python benchmarks/bm25s_numpy.py --other /tmp/np126/bin/python [--rounds 2]

Needs only bm25s, numpy and PyStemmer (not ragrl), so any virtualenv with those runs it. Both sides must
return the same top-k scores, query by query, within 1e-4 (checked; which equal-score passages fill
the last places may differ). The last line
printed is the ratio of ``--other``'s throughput to this interpreter's (best round each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RAGRL_SHARED_DATA", ROOT.parent / "shared" / "data"))
CORPUS = DATA / "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json"
QUESTIONS = DATA / "2wikimultihopqa/peterbaile__lag/dev.json"


def measure(queries: int, repeats: int) -> dict[str, object]:
    """This interpreter's raw bm25s: queries a second (best of ``repeats``) and a checksum of the hits."""
    import bm25s
    import numpy as np
    import Stemmer

    texts = [f"{p['title']}\n{p['text']}" for p in json.loads(CORPUS.read_text())]
    questions = [q["question"] for q in json.loads(QUESTIONS.read_text())][:queries]
    stemmer = Stemmer.Stemmer("english")
    model = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    corpus_tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
    model.index(corpus_tokens, show_progress=False)

    def run():  # noqa: ANN202
        tokens = bm25s.tokenize(questions, stopwords="en", stemmer=stemmer, show_progress=False)
        return model.retrieve(tokens, k=10, show_progress=False)

    docs, scores = run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {
        "numpy": np.__version__,
        "bm25s": bm25s.__version__,
        "qps": len(questions) / min(times),
        "scores": np.sort(scores, axis=1).tolist(),
        "docs": np.sort(docs, axis=1).tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", help="the other virtualenv's python (its numpy is the comparison)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two interpreters")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one measurement, as JSON
    args = ap.parse_args()
    if args.once:
        print(json.dumps(measure(args.queries, args.repeats)))
        return
    if not args.other:
        ap.error("--other PYTHON is required (a virtualenv with another numpy; see the docstring)")
    pythons = {"this": sys.executable, "other": args.other}
    best: dict[str, dict[str, object]] = {}
    for round_ in range(1, args.rounds + 1):
        for name, python in pythons.items():
            command = [python, __file__, "--once", "--queries", str(args.queries)]
            command += ["--repeats", str(args.repeats)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                sys.exit(f"{python}: failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.splitlines()[-1])
            version = f"numpy {row['numpy']} (bm25s {row['bm25s']})"
            print(f"round {round_}: {version}: {row['qps']:8,.0f} queries/s", flush=True)
            if name not in best or row["qps"] > best[name]["qps"]:
                best[name] = row
    this, other = best["this"], best["other"]
    # float32 sums may round differently across numpy versions (a unit in the last place)
    pairs = zip(this["scores"], other["scores"], strict=True)
    gap = max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True))
    if gap > 1e-4:
        sys.exit(f"the two numpy versions' scores differ by up to {gap:.2e}")
    ties = sum(a != b for a, b in zip(this["docs"], other["docs"], strict=True))
    print(
        f"the same scores for all {len(this['docs'])} queries (within {gap:.1e}); {ties} differ in which "
        "equal or nearly equal-score passages fill the last places"
    )
    ratio = best["other"]["qps"] / best["this"]["qps"]
    print(f"numpy {best['other']['numpy']} / numpy {best['this']['numpy']} throughput ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
