"""Server fairness: latency of small requests to ``ragrl serve`` while one client keeps sending
512-query requests, with fair rounds of 64 queries (``--batch-queries 64``, the default) vs rounds of
512 (a round can hold a whole big request, so a small one behind it waits: close to a plain lock).

    .venv/bin/python benchmarks/server_fairness.py [--small-clients 8] [--requests 100]
        [--retriever bm25|dense] [--big-repeat 8] [--workdir DIR]

Both servers serve the same index over the 2Wiki corpus sample on 127.0.0.1, one after the other
(client and server share the machine): BM25, or with ``--retriever dense`` the default MiniLM encoder
(a slower retriever: every query is encoded on the CPU), built once into ``--workdir`` when one is given.
Each query of a big request is a question repeated ``--big-repeat`` times. The last line printed is the
ratio of the small requests' p99 latency, rounds of 512 / fair rounds of 64.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ragrl.data.io import read_corpus
from ragrl.retrieval.base import MANIFEST_NAME
from ragrl.retrieval.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RAGRL_SHARED_DATA", ROOT.parent / "shared" / "data"))
CORPUS = DATA / "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json"
QUESTIONS = DATA / "2wikimultihopqa/peterbaile__lag/dev.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_health(url: str, server: subprocess.Popen, timeout: float = 600.0) -> float:
    """Poll ``url``'s /health until the server answers; its start-up seconds. Exits if the server dies
    or ``timeout`` passes first."""
    t0 = time.perf_counter()
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.perf_counter() - t0 > timeout:
            sys.exit(f"the server at {url} did not start")
        time.sleep(0.2)


def measure(
    index: Path, batch_queries: int, questions: list[str], small_clients: int, requests: int, repeat: int
) -> dict:
    big_queries = [" ".join([q] * repeat) for q in questions[:512]]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "ragrl", "serve", str(index), "--port", str(port)]
    server = subprocess.Popen(
        [*cmd, "--batch-queries", str(batch_queries)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_health(url, server)
        small: list[float] = []
        big: list[float] = []
        stop = threading.Event()

        def big_client() -> None:
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    t = time.perf_counter()
                    client.post(
                        f"{url}/retrieve", json={"queries": big_queries, "topk": 10}
                    ).raise_for_status()
                    big.append(time.perf_counter() - t)

        def small_client(c: int) -> None:
            with httpx.Client(timeout=120) as client:
                for r in range(requests):
                    q = questions[(c * requests + r) % len(questions)]
                    t = time.perf_counter()
                    client.post(f"{url}/retrieve", json={"queries": [q], "topk": 3}).raise_for_status()
                    small.append(time.perf_counter() - t)

        heavy = threading.Thread(target=big_client)
        heavy.start()
        time.sleep(0.5)  # the big client is busy before the small ones arrive
        t0 = time.perf_counter()
        threads = [threading.Thread(target=small_client, args=(c,)) for c in range(small_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        stop.set()
        heavy.join()
    finally:
        server.terminate()
        server.wait(timeout=30)
    small.sort()
    return {
        "p50": statistics.median(small),
        "p99": small[int(0.99 * (len(small) - 1))],
        "small_per_s": len(small) / elapsed,
        "big_median": statistics.median(big),
        "big_per_s": len(big) / elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small-clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument(
        "--big-repeat",
        type=int,
        default=8,
        help="Each big-request query is a question repeated N times "
        "(8: about 0.3 MB per request, within the default 1 MiB limit).",
    )
    ap.add_argument("--retriever", choices=["bm25", "dense"], default="bm25")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the built index here (reused)")
    args = ap.parse_args()

    passages, _ = read_corpus(CORPUS)
    questions = [q["question"] for q in json.loads(QUESTIONS.read_text())]
    questions = (questions * (512 // len(questions) + 1))[:1024]
    with tempfile.TemporaryDirectory() as tmp:
        index = (args.workdir or Path(tmp)) / args.retriever
        if not (index / MANIFEST_NAME).is_file():
            if args.retriever == "dense":
                from ragrl.retrieval.dense import DenseRetriever

                DenseRetriever.build(passages, device="cpu").save(index)
            else:
                BM25Retriever.build(passages).save(index)
        clients = f"{args.small_clients} small clients x {args.requests} requests"
        print(
            f"corpus: {len(passages):,} passages, {args.retriever}; {clients} beside one client of 512-query "
            f"requests (each query a question repeated {args.big_repeat} times)"
        )
        results = {}
        for batch_queries, name in ((512, "rounds of 512"), (64, "fair rounds (64)")):
            r = measure(index, batch_queries, questions, args.small_clients, args.requests, args.big_repeat)
            results[batch_queries] = r
            print(
                f"{name:>22}: small requests p50 {1000 * r['p50']:.0f} ms, p99 {1000 * r['p99']:.0f} ms, "
                f"{r['small_per_s']:.0f}/s; 512-query requests median {r['big_median']:.2f} s, "
                f"{r['big_per_s']:.1f}/s"
            )
    print(f"p99 ratio (rounds of 512 / fair rounds of 64): {results[512]['p99'] / results[64]['p99']:.1f}x")


if __name__ == "__main__":
    main()
